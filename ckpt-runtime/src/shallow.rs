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
/// `nn::BatchNorm`, `nn::Embedding`, `nn::LSTMState`, `nn::GRUState`. tch 0.26 keeps the
/// weights of `nn::LSTM` / `nn::GRU` in a private field, so they cannot be shallow-cloned:
/// wrap them in [`Shared`]. `#[derive(ShallowClone)]` implements it for your structs.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not implement `ckpt::ShallowClone`",
    label = "a checkpointed segment captures this by shallow clone",
    note = "add `#[derive(ckpt::ShallowClone)]` to your struct, or wrap a type you cannot change in `ckpt::Shared`"
)]
pub trait ShallowClone {
    /// A copy sharing every tensor with `self`.
    fn shallow_clone(&self) -> Self;
}

impl ShallowClone for Tensor {
    fn shallow_clone(&self) -> Self {
        Tensor::shallow_clone(self)
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
}

impl<T: ShallowClone> ShallowClone for Vec<T> {
    fn shallow_clone(&self) -> Self {
        self.iter().map(T::shallow_clone).collect()
    }
}

impl<T: ShallowClone> ShallowClone for Box<T> {
    fn shallow_clone(&self) -> Self {
        Box::new(T::shallow_clone(self))
    }
}

impl<T: ShallowClone, const N: usize> ShallowClone for [T; N] {
    fn shallow_clone(&self) -> Self {
        std::array::from_fn(|i| self[i].shallow_clone())
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
/// shallow-cloned (tch's `nn::LSTM` / `nn::GRU`, `nn::Sequential`, a foreign type).
///
/// Its [`ShallowClone`] is an `Arc` clone; access goes through a mutex (uncontended in
/// practice: a segment runs once in forward and once in backward). It implements
/// [`Module`] (hence `ModuleT`) when the inner type does; for anything else use
/// [`Shared::lock`].
///
/// ```
/// # extern crate ckpt_runtime as ckpt;
/// # use tch::nn;
/// let vs = nn::VarStore::new(tch::Device::Cpu);
/// let lstm = ckpt::Shared::new(nn::lstm(vs.root() / "lstm", 8, 16, Default::default()));
/// let state = { use tch::nn::RNN; lstm.lock().zero_state(4) };
/// # let _ = state;
/// ```
#[derive(Debug, Default)]
pub struct Shared<T>(Arc<Mutex<T>>);

impl<T> Shared<T> {
    /// Wraps `value`.
    pub fn new(value: T) -> Self {
        Shared(Arc::new(Mutex::new(value)))
    }

    /// Locks the inner value. A panic in another holder does not poison it for later use.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> ShallowClone for Shared<T> {
    fn shallow_clone(&self) -> Self {
        Shared(Arc::clone(&self.0))
    }
}

impl<T: Module> Module for Shared<T> {
    fn forward(&self, xs: &Tensor) -> Tensor {
        self.lock().forward(xs)
    }
}

impl ShallowClone for nn::Linear {
    fn shallow_clone(&self) -> Self {
        nn::Linear {
            ws: self.ws.shallow_clone(),
            bs: self.bs.shallow_clone(),
        }
    }
}

impl ShallowClone for nn::LSTMState {
    fn shallow_clone(&self) -> Self {
        nn::LSTMState(self.0.shallow_clone())
    }
}

impl ShallowClone for nn::GRUState {
    fn shallow_clone(&self) -> Self {
        nn::GRUState(self.0.shallow_clone())
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
