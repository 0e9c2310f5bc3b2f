//! [`ShallowClone`]: copies of module state that share tensors with the original.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

mod nn_layers;

/// A copy that shares every tensor with the original: same storage, same autograd
/// identity (`requires_grad`, `.grad()`), so gradients computed through the copy land in
/// the original's `VarStore` variables. Non-tensor state is cloned.
///
/// A checkpointed closure must own what it touches (it may run again in backward, after
/// the caller returned), so module state enters it through a shallow clone: cheap (one
/// reference-count increment per tensor) and safe even if the model is dropped or moved
/// before backward.
///
/// Implemented for `Tensor`, `Option`, `Vec`, `Box`, arrays, tuples, numbers, `bool`,
/// `String`, `Kind`, `Device`, `Arc`, [`Shared`], and tch's layers `nn::Linear`,
/// `nn::Conv1D/2D/3D`, `nn::ConvTranspose1D/2D/3D`, `nn::LayerNorm`, `nn::GroupNorm`,
/// `nn::BatchNorm`, `nn::Embedding`, `nn::GRU`, `nn::LSTM`, `nn::LSTMState`, `nn::GRUState`.
/// `#[derive(ShallowClone)]` implements it for your structs. Closure-built modules
/// (`nn::FuncT`, `nn::SequentialT`, `Box<dyn ModuleT>`) cannot be copied: wrap them in
/// [`Shared`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not implement `ckpt::ShallowClone`",
    label = "a checkpointed segment captures this by shallow clone",
    note = "add `#[derive(ckpt::ShallowClone)]` to your struct, or wrap a type you cannot change in `ckpt::Shared`"
)]
pub trait ShallowClone {
    /// A copy sharing every tensor with `self`.
    fn shallow_clone(&self) -> Self;

    /// Calls `f` on every tensor `self` holds (weights, biases, buffers), so that a
    /// checkpoint can list them as inputs of its node
    /// ([`CheckpointOptions::parameters_of`](crate::CheckpointOptions::parameters_of)):
    /// then `run_backward` returns their gradients and each one's accumulator node runs
    /// once per backward. The default visits nothing (the tensors stay unseen: their
    /// gradients are accumulated in the recompute, as for any captured tensor); the
    /// derive, the implementations of this crate and `model!` visit every tensor.
    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
        let _ = f;
    }
}

impl ShallowClone for Tensor {
    fn shallow_clone(&self) -> Self {
        Tensor::shallow_clone(self)
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
        f(self)
    }
}

macro_rules! by_clone {
    ($($t:ty),* $(,)?) => {$(
        impl ShallowClone for $t {
            fn shallow_clone(&self) -> Self {
                self.clone()
            }
        }
    )*};
}

crate::stash::with_plain_values!(
    by_clone,
    nn::LinearConfig,
    nn::ConvConfig,
    nn::LayerNormConfig,
    nn::BatchNormConfig,
    nn::GroupNormConfig,
    nn::EmbeddingConfig,
    nn::RNNConfig,
);

impl<T: ShallowClone> ShallowClone for Option<T> {
    fn shallow_clone(&self) -> Self {
        self.as_ref().map(T::shallow_clone)
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
        if let Some(t) = self {
            t.visit_tensors(f);
        }
    }
}

impl<T: ShallowClone> ShallowClone for Vec<T> {
    fn shallow_clone(&self) -> Self {
        self.iter().map(T::shallow_clone).collect()
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
        self.iter().for_each(|t| t.visit_tensors(f));
    }
}

impl<T: ShallowClone> ShallowClone for Box<T> {
    fn shallow_clone(&self) -> Self {
        Box::new(T::shallow_clone(self))
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
        T::visit_tensors(self, f);
    }
}

impl<T: ShallowClone, const N: usize> ShallowClone for [T; N] {
    fn shallow_clone(&self) -> Self {
        std::array::from_fn(|i| self[i].shallow_clone())
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
        self.iter().for_each(|t| t.visit_tensors(f));
    }
}

impl<T: ?Sized> ShallowClone for Arc<T> {
    fn shallow_clone(&self) -> Self {
        Arc::clone(self)
    }
}

impl<T> ShallowClone for std::marker::PhantomData<T> {
    fn shallow_clone(&self) -> Self {
        std::marker::PhantomData
    }
}

macro_rules! tuples {
    ($( ($($name:ident $idx:tt),+) )*) => {$(
        impl<$($name: ShallowClone),+> ShallowClone for ($($name,)+) {
            fn shallow_clone(&self) -> Self {
                ($(self.$idx.shallow_clone(),)+)
            }

            fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
                $(self.$idx.visit_tensors(f);)+
            }
        }
    )*};
}

tuples! {
    (A 0)
    (A 0, B 1)
    (A 0, B 1, C 2)
    (A 0, B 1, C 2, D 3)
    (A 0, B 1, C 2, D 3, E 4)
    (A 0, B 1, C 2, D 3, E 4, F 5)
    (A 0, B 1, C 2, D 3, E 4, F 5, G 6)
    (A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7)
}

/// A module shared by reference counting: the way to capture a module that cannot be
/// shallow-cloned (closure-built `nn::FuncT`, `nn::SequentialT`, `nn::Sequential`, a foreign type).
///
/// Its [`ShallowClone`] is an `Arc` clone; access goes through a mutex (uncontended in
/// practice: a segment runs once in forward and once in backward). It implements
/// `ModuleT` when the inner type does (`Module` types included; see the impl), so
/// closure-built models (`nn::func_t`, `nn::seq_t`, `Box<dyn ModuleT>`) checkpoint
/// through it unchanged; for anything else use [`Shared::lock`].
///
/// ```
/// # extern crate ckpt_runtime as ckpt;
/// # use tch::nn;
/// let vs = nn::VarStore::new(tch::Device::Cpu);
/// let lstm = ckpt::Shared::new(nn::lstm(vs.root() / "lstm", 8, 16, Default::default()));
/// let state = { use tch::nn::RNN; lstm.lock().zero_state(4) };
/// # let _ = state;
/// ```
///
/// `ckpt` cannot see the tensors of a closure-built module: list them with
/// [`Shared::with_parameters`] so that the checkpoints capturing it (a
/// `checkpoint_sequential_t` group, a `#[checkpointed]` or `model!` field) make them inputs
/// of their nodes, as they do for the tensors of `ShallowClone` types.
#[derive(Debug, Default)]
pub struct Shared<T>(Arc<Mutex<T>>, Arc<Mutex<Vec<Tensor>>>);

impl<T> Shared<T> {
    /// Wraps `value`.
    pub fn new(value: T) -> Self {
        Shared(Arc::new(Mutex::new(value)), Arc::default())
    }

    /// Lists the tensors of the inner value (for a closure-built block, the variables of
    /// its `VarStore` path), for [`ShallowClone::visit_tensors`]: checkpoints that capture
    /// this value then see them, so `run_backward` returns their gradients
    /// ([`CheckpointOptions::parameters`](crate::CheckpointOptions::parameters)). Shared by
    /// every shallow clone.
    ///
    /// ```
    /// # extern crate ckpt_runtime as ckpt;
    /// # use tch::nn;
    /// let vs = nn::VarStore::new(tch::Device::Cpu);
    /// let block = nn::seq_t().add(nn::linear(vs.root() / "fc", 4, 4, Default::default()));
    /// let block = ckpt::Shared::new(block).with_parameters(&vs.trainable_variables());
    /// # let _ = block;
    /// ```
    pub fn with_parameters<'a>(self, tensors: impl IntoIterator<Item = &'a Tensor>) -> Self {
        *self.1.lock().unwrap_or_else(PoisonError::into_inner) =
            tensors.into_iter().map(Tensor::shallow_clone).collect();
        self
    }

    /// Locks the inner value. A panic in another holder does not poison it for later use.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> ShallowClone for Shared<T> {
    fn shallow_clone(&self) -> Self {
        Shared(Arc::clone(&self.0), Arc::clone(&self.1))
    }

    /// The tensors listed with [`Shared::with_parameters`] (none by default).
    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
        self.1
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .for_each(f);
    }
}

/// `forward_t` of the inner module: a shared `nn::FuncT`, `nn::SequentialT`, `Box<dyn
/// ModuleT>` or any `Module` (through tch's blanket `impl<T: Module> ModuleT for T`) is a
/// `ModuleT`, so it goes into `checkpoint_sequential_t`, `model!` `#[train]` stages and
/// `xs.apply_t(&shared, train)` as the module itself would.
///
/// `Shared<T>` does not also implement `Module` when `T: Module`: tch's blanket impl would
/// then give it a second `ModuleT`, which Rust rejects. [`Shared::forward`] (inherent)
/// keeps `shared.forward(&xs)` working; where a `Module` is required (`xs.apply`,
/// `nn::seq().add`), use `xs.apply_t(&shared, false)` or `&*shared.lock()`.
impl<T: nn::ModuleT> nn::ModuleT for Shared<T> {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        nn::ModuleT::forward_t(&*self.lock(), xs, train)
    }
}

impl<T: Module> Shared<T> {
    /// `Module::forward` of the inner module.
    pub fn forward(&self, xs: &Tensor) -> Tensor {
        self.lock().forward(xs)
    }
}
