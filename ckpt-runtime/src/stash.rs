//! [`Stash`]: how values enter and leave a checkpointed segment.

use tch::{Device, Kind, Tensor};

/// A value that can be an input or an output of a checkpointed segment.
///
/// In forward, a segment's input is split into its tensors (stashed by the autograd node,
/// which is what checkpointing keeps in memory) and a tensor-free *skeleton* (the rest of
/// the value: numbers, lengths, `None`s). In backward the input is rebuilt from the
/// skeleton and the stashed tensors, detached from the forward graph, and the segment is
/// replayed on it. Outputs take the same path the other way.
///
/// Implemented for [`Tensor`], tuples (up to 12), `Vec<T>`, arrays `[T; N]`,
/// `Option<T>`, `Box<T>`, numbers, `bool`, `char`, `()`, `String`, `&'static str`,
/// [`Kind`], [`Device`], tch's recurrent states `nn::GRUState` and `nn::LSTMState`, and
/// [`Carry<T>`] for any other `Clone + Send` value. Non-tensor
/// values are carried as they are and are not differentiated.
///
/// `#[checkpointed]` moves every value that is live across a cut through this trait;
/// a value whose type does not implement it is a compile error on that binding.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot cross a checkpoint boundary",
    label = "this value enters or leaves a checkpointed segment, so its type must implement `ckpt::Stash`",
    note = "`Stash` is implemented for `Tensor`, tuples, `Vec`, arrays, `Option`, numbers, `bool`, `String`, `Kind` and `Device`",
    note = "a reference cannot be stashed: pass an owned value (`t.shallow_clone()` for a `&Tensor`), or wrap another `Clone + Send` value in `ckpt::Carry(..)`"
)]
pub trait Stash: Sized + 'static {
    /// Everything but the tensors; kept by the node until backward.
    type Skeleton: Send + 'static;

    /// Moves this value's tensors, in a fixed order, to the end of `tensors`, and
    /// returns the rest.
    fn unpack(self, tensors: &mut Vec<Tensor>) -> Self::Skeleton;

    /// Rebuilds a value from its skeleton, taking its tensors from `tensors` in the order
    /// [`Stash::unpack`] pushed them.
    ///
    /// # Panics
    ///
    /// If `tensors` runs out (the runtime always passes exactly what `unpack` produced).
    fn pack(skeleton: &Self::Skeleton, tensors: &mut std::vec::IntoIter<Tensor>) -> Self;
}

impl Stash for Tensor {
    type Skeleton = ();
    fn unpack(self, tensors: &mut Vec<Tensor>) {
        tensors.push(self);
    }
    fn pack(_: &(), tensors: &mut std::vec::IntoIter<Tensor>) -> Self {
        tensors
            .next()
            .expect("ckpt: a stash has fewer tensors than its skeleton needs")
    }
}

macro_rules! carried {
    ($($t:ty),* $(,)?) => {$(
        impl Stash for $t {
            type Skeleton = $t;
            fn unpack(self, _: &mut Vec<Tensor>) -> $t {
                self
            }
            fn pack(skeleton: &$t, _: &mut std::vec::IntoIter<Tensor>) -> Self {
                skeleton.clone()
            }
        }
    )*};
}

/// Calls `$apply!` with the plain values, followed by `$extra`: the types a checkpoint
/// carries unchanged ([`Stash`], here) and module state clones whole
/// ([`ShallowClone`](crate::ShallowClone), `shallow/mod.rs`).
macro_rules! with_plain_values {
    ($apply:ident $(, $extra:ty)* $(,)?) => {
        $apply!(
            (), bool, char, i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize,
            f32, f64, String, &'static str, Kind, Device $(, $extra)*
        );
    };
}
pub(crate) use with_plain_values;

with_plain_values!(carried);

/// Carries any `Clone + Send` value through a checkpoint boundary unchanged (it is cloned
/// for the recompute). Use it for configuration values that are not covered by
/// [`Stash`]'s own implementations.
///
/// ```
/// # extern crate ckpt_runtime as ckpt;
/// # use ckpt::{Carry, Stash};
/// #[derive(Clone)]
/// struct Mask { causal: bool }
/// fn takes<T: Stash>(_: T) {}
/// takes(Carry(Mask { causal: true }));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Carry<T>(pub T);

impl<T: Clone + Send + 'static> Stash for Carry<T> {
    type Skeleton = T;
    fn unpack(self, _: &mut Vec<Tensor>) -> T {
        self.0
    }
    fn pack(skeleton: &T, _: &mut std::vec::IntoIter<Tensor>) -> Self {
        Carry(skeleton.clone())
    }
}

impl<T: Stash> Stash for Option<T> {
    type Skeleton = Option<T::Skeleton>;
    fn unpack(self, tensors: &mut Vec<Tensor>) -> Self::Skeleton {
        self.map(|v| v.unpack(tensors))
    }
    fn pack(skeleton: &Self::Skeleton, tensors: &mut std::vec::IntoIter<Tensor>) -> Self {
        skeleton.as_ref().map(|s| T::pack(s, tensors))
    }
}

impl<T: Stash> Stash for Box<T> {
    type Skeleton = T::Skeleton;
    fn unpack(self, tensors: &mut Vec<Tensor>) -> Self::Skeleton {
        (*self).unpack(tensors)
    }
    fn pack(skeleton: &Self::Skeleton, tensors: &mut std::vec::IntoIter<Tensor>) -> Self {
        Box::new(T::pack(skeleton, tensors))
    }
}

impl<T: Stash> Stash for Vec<T> {
    type Skeleton = Vec<T::Skeleton>;
    fn unpack(self, tensors: &mut Vec<Tensor>) -> Self::Skeleton {
        self.into_iter().map(|v| v.unpack(tensors)).collect()
    }
    fn pack(skeleton: &Self::Skeleton, tensors: &mut std::vec::IntoIter<Tensor>) -> Self {
        skeleton.iter().map(|s| T::pack(s, tensors)).collect()
    }
}

impl<T: Stash, const N: usize> Stash for [T; N] {
    type Skeleton = [T::Skeleton; N];
    fn unpack(self, tensors: &mut Vec<Tensor>) -> Self::Skeleton {
        self.map(|v| v.unpack(tensors))
    }
    fn pack(skeleton: &Self::Skeleton, tensors: &mut std::vec::IntoIter<Tensor>) -> Self {
        // `from_fn` calls the closure for indices 0, 1, .. in order.
        std::array::from_fn(|i| T::pack(&skeleton[i], tensors))
    }
}

macro_rules! tuples {
    ($( ($($name:ident $idx:tt),+) )*) => {$(
        impl<$($name: Stash),+> Stash for ($($name,)+) {
            type Skeleton = ($($name::Skeleton,)+);
            fn unpack(self, tensors: &mut Vec<Tensor>) -> Self::Skeleton {
                ($(self.$idx.unpack(tensors),)+)
            }
            fn pack(skeleton: &Self::Skeleton, tensors: &mut std::vec::IntoIter<Tensor>) -> Self {
                ($($name::pack(&skeleton.$idx, tensors),)+)
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
    (A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8)
    (A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9)
    (A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10)
    (A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11)
}

/// A GRU's state (tch's `nn::GRUState`, `[layers, batch, hidden]`): its tensor. Recurrent
/// states carry the autograd history of the call, so they enter a segment as inputs.
impl Stash for tch::nn::GRUState {
    type Skeleton = ();
    fn unpack(self, tensors: &mut Vec<Tensor>) {
        tensors.push(self.0);
    }
    fn pack(_: &(), tensors: &mut std::vec::IntoIter<Tensor>) -> Self {
        tch::nn::GRUState(Tensor::pack(&(), tensors))
    }
}

/// An LSTM's state (tch's `nn::LSTMState`: `(h, c)`, each `[layers, batch, hidden]`).
impl Stash for tch::nn::LSTMState {
    type Skeleton = ();
    fn unpack(self, tensors: &mut Vec<Tensor>) {
        let (h, c) = self.0;
        tensors.push(h);
        tensors.push(c);
    }
    fn pack(_: &(), tensors: &mut std::vec::IntoIter<Tensor>) -> Self {
        let h = Tensor::pack(&(), tensors);
        let c = Tensor::pack(&(), tensors);
        tch::nn::LSTMState((h, c))
    }
}

impl<T: Clone> crate::ShallowClone for Carry<T> {
    /// A `Clone` of the carried value (it holds no tensors).
    fn shallow_clone(&self) -> Self {
        self.clone()
    }
}
