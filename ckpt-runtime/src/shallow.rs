//! [`ShallowClone`]: copies of module state that share tensors with the original.

use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

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

by_clone!(
    (),
    bool,
    char,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    f32,
    f64,
    String,
    &'static str,
    Kind,
    Device,
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

/// `visit_tensors` of a layer: the listed tensor fields, `Option`s included.
macro_rules! visit_fields {
    ($($field:ident),+) => {
        fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
            $(ShallowClone::visit_tensors(&self.$field, f);)+
        }
    };
}

impl ShallowClone for nn::Linear {
    fn shallow_clone(&self) -> Self {
        nn::Linear {
            ws: self.ws.shallow_clone(),
            bs: self.bs.shallow_clone(),
        }
    }

    visit_fields!(ws, bs);
}

impl ShallowClone for nn::LSTMState {
    fn shallow_clone(&self) -> Self {
        nn::LSTMState(self.0.shallow_clone())
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
        self.0.visit_tensors(f);
    }
}

impl ShallowClone for nn::GRUState {
    fn shallow_clone(&self) -> Self {
        nn::GRUState(self.0.shallow_clone())
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
        self.0.visit_tensors(f);
    }
}

/// Bitwise copy of `orig` whose non-`Copy` public fields `fix` then overwrites (with
/// `std::ptr::write`, so the aliased originals are not dropped).
///
/// # Safety
///
/// Every field of `T` that `fix` does not overwrite must be of a `Copy` type (no heap, no
/// `Drop`), so that the bitwise copy of it is an independent value.
unsafe fn copy_then_fix<T>(orig: &T, fix: impl FnOnce(&mut T)) -> T {
    // SAFETY: the copy aliases `orig`'s non-Copy fields until `fix` replaces them; it is
    // kept in `ManuallyDrop` until then, so if `fix` panics it leaks instead of freeing
    // what `orig` still owns.
    let mut copy = ManuallyDrop::new(unsafe { std::ptr::read(orig) });
    fix(&mut copy);
    ManuallyDrop::into_inner(copy)
}

// The layers below have exactly one private field, `config`, of a public `Copy` type
// (checked against tch 0.26.0, which the workspace pins with `=`): the assertions make
// the `Copy` part a compile-time fact.
const _: fn() = || {
    fn copy<T: Copy>() {}
    copy::<nn::LayerNormConfig>();
    copy::<nn::GroupNormConfig>();
    copy::<nn::BatchNormConfig>();
    copy::<nn::EmbeddingConfig>();
    copy::<nn::ConvTransposeConfigND<[i64; 1]>>();
    copy::<nn::ConvTransposeConfigND<[i64; 2]>>();
    copy::<nn::ConvTransposeConfigND<[i64; 3]>>();
};

impl ShallowClone for nn::LayerNorm {
    fn shallow_clone(&self) -> Self {
        // SAFETY: `LayerNorm { config: LayerNormConfig (Copy, private), ws, bs,
        // normalized_shape }`: every non-Copy field is overwritten below.
        unsafe {
            copy_then_fix(self, |c| {
                std::ptr::write(&mut c.ws, self.ws.shallow_clone());
                std::ptr::write(&mut c.bs, self.bs.shallow_clone());
                std::ptr::write(&mut c.normalized_shape, self.normalized_shape.clone());
            })
        }
    }

    visit_fields!(ws, bs);
}

impl ShallowClone for nn::GroupNorm {
    fn shallow_clone(&self) -> Self {
        // SAFETY: `GroupNorm { config: GroupNormConfig (Copy, private), ws, bs,
        // num_groups, num_channels }`: `ws` and `bs` are overwritten, the rest is Copy.
        unsafe {
            copy_then_fix(self, |c| {
                std::ptr::write(&mut c.ws, self.ws.shallow_clone());
                std::ptr::write(&mut c.bs, self.bs.shallow_clone());
            })
        }
    }

    visit_fields!(ws, bs);
}

impl ShallowClone for nn::BatchNorm {
    fn shallow_clone(&self) -> Self {
        // SAFETY: `BatchNorm { config: BatchNormConfig (Copy, private), running_mean,
        // running_var, ws, bs, nd }`: the tensors are overwritten, `nd` is Copy. The
        // running statistics are shared, as the module's own state is.
        unsafe {
            copy_then_fix(self, |c| {
                std::ptr::write(&mut c.running_mean, self.running_mean.shallow_clone());
                std::ptr::write(&mut c.running_var, self.running_var.shallow_clone());
                std::ptr::write(&mut c.ws, self.ws.shallow_clone());
                std::ptr::write(&mut c.bs, self.bs.shallow_clone());
            })
        }
    }

    visit_fields!(ws, bs, running_mean, running_var);
}

impl ShallowClone for nn::Embedding {
    fn shallow_clone(&self) -> Self {
        // SAFETY: `Embedding { ws, config: EmbeddingConfig (Copy, private) }`.
        unsafe {
            copy_then_fix(self, |c| {
                std::ptr::write(&mut c.ws, self.ws.shallow_clone())
            })
        }
    }

    visit_fields!(ws);
}

impl<ND: Copy> ShallowClone for nn::ConvTransposeND<ND> {
    fn shallow_clone(&self) -> Self {
        // SAFETY: `ConvTransposeND { ws, bs, config: ConvTransposeConfigND<ND> (private) }`
        // with `ND: Copy`, which makes the config `Copy` (it derives `Clone, Copy`).
        unsafe {
            copy_then_fix(self, |c| {
                std::ptr::write(&mut c.ws, self.ws.shallow_clone());
                std::ptr::write(&mut c.bs, self.bs.shallow_clone());
            })
        }
    }

    visit_fields!(ws, bs);
}

/// `nn::Conv` keeps a private `Vec` next to its private config, so a bitwise copy would
/// alias it. The clone is rebuilt through tch's own constructor instead, on a throwaway
/// `VarStore` with empty weights, from the configuration that `Conv`'s `Debug` output
/// shows; then its weights are pointed at the original's.
trait ConvDims: Copy + AsRef<[i64]> + for<'a> TryFrom<&'a [i64]> {}
impl ConvDims for [i64; 1] {}
impl ConvDims for [i64; 2] {}
impl ConvDims for [i64; 3] {}

impl<ND: ConvDims + std::fmt::Debug> ShallowClone for nn::Conv<ND> {
    fn shallow_clone(&self) -> Self {
        let text = format!("{self:?}");
        let config = conv_config::<ND>(&text, self.bs.is_some())
            .unwrap_or_else(|| panic!("ckpt: cannot read the configuration of {text}"));
        let ksizes: ND = self.ws.size()[2..].try_into().unwrap_or_else(|_| {
            panic!(
                "ckpt: unexpected convolution weight shape {:?}",
                self.ws.size()
            )
        });
        let throwaway = nn::VarStore::new(Device::Cpu);
        let groups = config.groups;
        let mut conv = nn::conv(throwaway.root(), groups, 0, ksizes, config);
        conv.ws = self.ws.shallow_clone();
        conv.bs = self.bs.shallow_clone();
        conv
    }

    visit_fields!(ws, bs);
}

fn conv_config<ND: ConvDims>(debug: &str, bias: bool) -> Option<nn::ConvConfigND<ND>> {
    let config = &debug[debug.rfind("config: ")?..];
    let dims = |key: &str| -> Option<ND> {
        let v: Vec<i64> = field(config, key)?
            .trim_matches(|c| c == '[' || c == ']')
            .split(',')
            .map(|s| s.trim().parse().ok())
            .collect::<Option<_>>()?;
        ND::try_from(v.as_slice()).ok()
    };
    let padding_mode = match field(config, "padding_mode")? {
        "Zeros" => nn::PaddingMode::Zeros,
        "Reflect" => nn::PaddingMode::Reflect,
        "Replicate" => nn::PaddingMode::Replicate,
        "Circular" => nn::PaddingMode::Circular,
        _ => return None,
    };
    Some(nn::ConvConfigND {
        stride: dims("stride")?,
        padding: dims("padding")?,
        dilation: dims("dilation")?,
        groups: field(config, "groups")?.parse().ok()?,
        bias,
        ws_init: nn::Init::Const(0.),
        bs_init: nn::Init::Const(0.),
        padding_mode,
    })
}

/// The value of `key: value` at the top level of a `Name { .. }` Debug rendering.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let mut depth = 0i32;
    let bytes = text.as_bytes();
    let needle = format!("{key}: ");
    let mut i = 0;
    let mut start = None;
    while i < bytes.len() {
        match bytes[i] {
            b'{' | b'[' | b'(' => depth += 1,
            b'}' | b']' | b')' => depth -= 1,
            _ => {}
        }
        if depth == 1 && start.is_none() && text[i..].starts_with(&needle) {
            let preceded = i > 0 && matches!(bytes[i - 1], b' ' | b'{');
            if preceded {
                start = Some(i + needle.len());
                i += needle.len();
                continue;
            }
        }
        if let Some(s) = start
            && ((depth == 1 && bytes[i] == b',') || depth == 0)
        {
            return Some(text[s..i].trim());
        }
        i += 1;
    }
    None
}

/// The fields of tch 0.26.0's `nn::GRU` and `nn::LSTM`, in their order and of their types
/// (both are `{ flat_weights: Vec<Tensor>, hidden_dim: i64, config: RNNConfig, device:
/// Device }`, all private). tch offers neither `Clone` nor access to the weights, so the
/// shallow clone reads the layer through this mirror. Two structs with the same field
/// types in the same order get the same layout from rustc, but the language does not
/// promise it: `transmute` checks the sizes at compile time, and [`rnn_layout_checked`]
/// checks every field at run time on a probe layer built with distinctive values before
/// the first clone, panicking (never reading a wrong layout) if they disagree.
struct RnnFields {
    flat_weights: Vec<Tensor>,
    hidden_dim: i64,
    config: nn::RNNConfig,
    device: Device,
}

const _: fn() = || {
    // Same size (also checked by `transmute` below) and alignment.
    let _ = std::mem::transmute::<RnnFields, nn::GRU>;
    let _ = std::mem::transmute::<RnnFields, nn::LSTM>;
    assert!(std::mem::align_of::<RnnFields>() == std::mem::align_of::<nn::GRU>());
    assert!(std::mem::align_of::<RnnFields>() == std::mem::align_of::<nn::LSTM>());
};

/// Whether [`RnnFields`] reads a GRU and an LSTM as tch built them: probe layers with a
/// distinctive hidden size, layer count, dropout and flags (on a throwaway `VarStore`)
/// are read through the mirror, and every field must come out as built, the weights with
/// the shapes tch gives them (`[gates * hidden, in]` then `[gates * hidden, hidden]`,
/// then the biases, per layer and direction).
fn rnn_layout_checked() -> bool {
    static CHECKED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CHECKED.get_or_init(|| {
        let vs = nn::VarStore::new(Device::Cpu);
        let config = nn::RNNConfig {
            has_biases: true,
            num_layers: 3,
            dropout: 0.375,
            train: false,
            bidirectional: true,
            batch_first: false,
            ..Default::default()
        };
        let (input, hidden) = (5, 7);
        let check = |fields: &RnnFields, gates: i64| {
            let c = &fields.config;
            fields.hidden_dim == hidden
                && c.has_biases
                && c.num_layers == 3
                && c.dropout == 0.375
                && !c.train
                && c.bidirectional
                && !c.batch_first
                && fields.device == Device::Cpu
                && fields.flat_weights.len() == 3 * 2 * 4
                && fields.flat_weights[0].size() == [gates * hidden, input]
                && fields.flat_weights[1].size() == [gates * hidden, hidden]
                && fields.flat_weights[2].size() == [gates * hidden]
        };
        let gru = nn::gru(vs.root() / "gru", input, hidden, config);
        let lstm = nn::lstm(vs.root() / "lstm", input, hidden, config);
        // SAFETY: the sizes and alignments are equal (checked at compile time); the
        // scalar fields are read first and the vector only when they all match, i.e.
        // when the mirror's offsets are the layer's.
        let scalars_ok = |f: *const RnnFields| unsafe {
            let f = &*f;
            f.hidden_dim == hidden && f.config.num_layers == 3 && f.config.dropout == 0.375
        };
        let gru_fields = (&gru as *const nn::GRU).cast::<RnnFields>();
        let lstm_fields = (&lstm as *const nn::LSTM).cast::<RnnFields>();
        if !(scalars_ok(gru_fields) && scalars_ok(lstm_fields)) {
            return false;
        }
        // SAFETY: as above, the scalars matched.
        let (gru_fields, lstm_fields) = unsafe { (&*gru_fields, &*lstm_fields) };
        check(gru_fields, 3) && check(lstm_fields, 4)
    })
}

/// The fields of a GRU or LSTM, read through [`RnnFields`].
///
/// # Safety
///
/// `R` must be `nn::GRU` or `nn::LSTM`.
unsafe fn rnn_fields<R>(orig: &R) -> &RnnFields {
    assert!(
        rnn_layout_checked(),
        "ckpt: the layout of tch's nn::GRU / nn::LSTM is not the one ckpt was written for (tch 0.26.0); wrap the layer in ckpt::Shared"
    );
    // SAFETY: `R` is a GRU or an LSTM, whose layout the mirror's was checked to be.
    unsafe { &*(orig as *const R).cast::<RnnFields>() }
}

/// The shallow clone of a GRU or LSTM read through [`RnnFields`].
///
/// # Safety
///
/// `R` must be `nn::GRU` or `nn::LSTM`.
unsafe fn rnn_shallow_clone<R>(orig: &R, to_r: fn(RnnFields) -> R) -> R {
    // SAFETY: as this function's contract.
    let fields = unsafe { rnn_fields(orig) };
    to_r(RnnFields {
        flat_weights: fields
            .flat_weights
            .iter()
            .map(Tensor::shallow_clone)
            .collect(),
        hidden_dim: fields.hidden_dim,
        config: fields.config,
        device: fields.device,
    })
}

impl ShallowClone for nn::GRU {
    /// Shares the weights (same tensors, same autograd identity), read through a mirror of
    /// tch 0.26.0's private fields whose layout is checked at compile and run time.
    fn shallow_clone(&self) -> Self {
        // SAFETY: `Self` is `nn::GRU`; the transmute is of the mirror checked above.
        unsafe { rnn_shallow_clone(self, |f| std::mem::transmute::<RnnFields, nn::GRU>(f)) }
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
        // SAFETY: `Self` is `nn::GRU`.
        unsafe { rnn_fields(self) }.flat_weights.iter().for_each(f);
    }
}

impl ShallowClone for nn::LSTM {
    /// Shares the weights (same tensors, same autograd identity), read through a mirror of
    /// tch 0.26.0's private fields whose layout is checked at compile and run time.
    fn shallow_clone(&self) -> Self {
        // SAFETY: `Self` is `nn::LSTM`; the transmute is of the mirror checked above.
        unsafe { rnn_shallow_clone(self, |f| std::mem::transmute::<RnnFields, nn::LSTM>(f)) }
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
        // SAFETY: `Self` is `nn::LSTM`.
        unsafe { rnn_fields(self) }.flat_weights.iter().for_each(f);
    }
}
