//! The environment of a `segments = auto` function's run: slots holding the values live
//! between its statements, unpacked as their [`Stash`] tensors and a shared skeleton, and
//! the calls the generated stages make on it (`put`, `take`, witnesses, key probes).

use std::any::Any;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use tch::Tensor;

use crate::plan::detached_leaf;
use crate::{Stash, lock};

/// The type of a value, at compile time only (`Copy`, `Send`, `Sync`, zero-sized).
pub struct Witness<T>(PhantomData<fn() -> T>);

impl<T> Clone for Witness<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Witness<T> {}

impl<T> Default for Witness<T> {
    fn default() -> Self {
        Witness(PhantomData)
    }
}

/// A skeleton that can be rebuilt from any number of times, by any thread.
type SharedSkeleton = Arc<Mutex<Box<dyn Any + Send>>>;

/// One value, unpacked: its tensors and its skeleton.
pub(super) struct Slot {
    pub(super) tensors: Vec<Tensor>,
    pub(super) skeleton: SharedSkeleton,
}

impl Slot {
    /// A copy sharing the tensors (shallow clones) and the skeleton.
    pub(super) fn dup(&self) -> Slot {
        Slot {
            tensors: self.tensors.iter().map(Tensor::shallow_clone).collect(),
            skeleton: Arc::clone(&self.skeleton),
        }
    }

    /// A copy with detached tensors (`leaf`: float ones set to require grad).
    pub(super) fn detached(&self, leaf: bool) -> Slot {
        Slot {
            tensors: self
                .tensors
                .iter()
                .map(|t| {
                    if !t.defined() {
                        Tensor::new()
                    } else if leaf {
                        detached_leaf(t)
                    } else {
                        t.detach()
                    }
                })
                .collect(),
            skeleton: Arc::clone(&self.skeleton),
        }
    }
}

/// The values of a function's bindings between statements, by slot.
pub struct Env {
    pub(super) slots: Vec<Option<Slot>>,
    /// Hashes of the arguments put with [`put_param`] (`None`: not `Hash`).
    pub(super) hashes: Vec<Option<u64>>,
}

impl Env {
    /// An environment of `slots` empty slots.
    pub fn new(slots: usize) -> Env {
        Env {
            slots: (0..slots).map(|_| None).collect(),
            hashes: Vec::new(),
        }
    }

    pub(super) fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.slots.iter().flatten().flat_map(|s| &s.tensors)
    }
}

/// Puts a value into a slot and returns the witness of its type.
pub fn put<T: Stash>(env: &mut Env, slot: usize, value: T) -> Witness<T> {
    let mut tensors = Vec::new();
    let skeleton = value.unpack(&mut tensors);
    env.slots[slot] = Some(Slot {
        tensors,
        skeleton: Arc::new(Mutex::new(Box::new(skeleton))),
    });
    Witness::default()
}

/// [`put`] for an argument of the function; `hash` (of the argument's value, when its
/// type implements `Hash`) becomes part of the key of the plan cache.
pub fn put_param<T: Stash>(env: &mut Env, slot: usize, hash: Option<u64>, value: T) -> Witness<T> {
    env.hashes.push(hash);
    put(env, slot, value)
}

/// Takes the value of a slot, of the witnessed type; with `keep`, a copy sharing its
/// tensors stays in the slot (the value is used again later).
///
/// # Panics
///
/// If the slot is empty or holds another type (a bug of the macro).
pub fn take<T: Stash>(env: &mut Env, slot: usize, _: Witness<T>, keep: bool) -> T {
    let s = if keep {
        env.slots[slot].as_ref().map(Slot::dup)
    } else {
        env.slots[slot].take()
    }
    .unwrap_or_else(|| panic!("ckpt: slot {slot} of the environment is empty"));
    let skeleton = lock(&s.skeleton);
    let skeleton = skeleton
        .downcast_ref::<T::Skeleton>()
        .expect("ckpt: a slot holds the type of its witness");
    T::pack(skeleton, &mut s.tensors.into_iter())
}

/// Autoref specialisation for the plan cache's key: `(&KeyProbe(&arg)).__ckpt_key_hash()`
/// hashes the argument when its type implements `Hash` ([`ViaHash`]) and gives `None`
/// otherwise ([`ViaNoHash`]).
pub struct KeyProbe<'a, T: ?Sized>(pub &'a T);

/// Picked first, when `T: Hash`.
pub trait ViaHash {
    /// The hash of the value.
    fn __ckpt_key_hash(&self) -> Option<u64>;
}

impl<T: Hash + ?Sized> ViaHash for KeyProbe<'_, T> {
    fn __ckpt_key_hash(&self) -> Option<u64> {
        let mut h = DefaultHasher::new();
        self.0.hash(&mut h);
        Some(h.finish())
    }
}

/// Picked otherwise.
pub trait ViaNoHash {
    /// `None`.
    fn __ckpt_key_hash(&self) -> Option<u64>;
}

impl<T: ?Sized> ViaNoHash for &KeyProbe<'_, T> {
    fn __ckpt_key_hash(&self) -> Option<u64> {
        None
    }
}

/// A unit of the chain on the environment: a statement (called with `0..1`), or a layer
/// loop called with a range of its iterations.
pub type StageFn = Box<dyn Fn(&mut Env, Range<usize>) + Send + Sync>;

/// Boxes a unit's closure; returns the witnesses it returns (never calling it: witnesses
/// are only types).
pub fn stage<W, F>(f: F) -> (StageFn, W)
where
    W: Default,
    F: Fn(&mut Env, Range<usize>) -> W + Send + Sync + 'static,
{
    (
        Box::new(move |env: &mut Env, range: Range<usize>| {
            let _ = f(env, range);
        }),
        W::default(),
    )
}

/// The value of the last statement in a profiling run, put into its slot when its type
/// implements [`Stash`] ([`ViaStashPut`]; otherwise dropped, [`ViaNoPut`]): the planner
/// then sees its bytes and backpropagates through it.
pub struct ProbePut<T>(pub std::cell::Cell<Option<T>>);

/// Picked first, when `T: Stash`.
pub trait ViaStashPut {
    /// Puts the value into `slot`.
    fn __ckpt_probe_put(&self, env: &mut Env, slot: usize);
}

impl<T: Stash> ViaStashPut for ProbePut<T> {
    fn __ckpt_probe_put(&self, env: &mut Env, slot: usize) {
        if let Some(value) = self.0.take() {
            put(env, slot, value);
        }
    }
}

/// Picked otherwise.
pub trait ViaNoPut {
    /// Drops the value.
    fn __ckpt_probe_put(&self, env: &mut Env, slot: usize);
}

impl<T> ViaNoPut for &ProbePut<T> {
    fn __ckpt_probe_put(&self, _: &mut Env, _: usize) {}
}

/// The number of iterations of a layer loop: the length of its iterable.
pub fn iter_count<I: IntoIterator>(iterable: I) -> usize {
    iterable.into_iter().count()
}

/// The items of iterations `range` of a layer loop, re-derived from its iterable (a slice
/// iterator skips in O(1)).
pub fn iter_range<I: IntoIterator>(
    iterable: I,
    range: Range<usize>,
) -> std::iter::Take<std::iter::Skip<I::IntoIter>> {
    let len = range.end.saturating_sub(range.start);
    iterable.into_iter().skip(range.start).take(len)
}

/// A list of slots, as a segment's input or output.
pub struct Slots(pub(super) Vec<(usize, Slot)>);

impl Stash for Slots {
    type Skeleton = Vec<(usize, usize, SharedSkeleton)>;

    fn unpack(self, tensors: &mut Vec<Tensor>) -> Self::Skeleton {
        self.0
            .into_iter()
            .map(|(i, s)| {
                let n = s.tensors.len();
                tensors.extend(s.tensors);
                (i, n, s.skeleton)
            })
            .collect()
    }

    fn pack(skeleton: &Self::Skeleton, tensors: &mut std::vec::IntoIter<Tensor>) -> Self {
        Slots(
            skeleton
                .iter()
                .map(|(i, n, sk)| {
                    let ts: Vec<Tensor> = tensors.by_ref().take(*n).collect();
                    assert_eq!(
                        ts.len(),
                        *n,
                        "ckpt: a stash has fewer tensors than its skeleton needs"
                    );
                    (
                        *i,
                        Slot {
                            tensors: ts,
                            skeleton: Arc::clone(sk),
                        },
                    )
                })
                .collect(),
        )
    }
}
