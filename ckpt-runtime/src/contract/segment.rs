//! Running one checkpointed segment from generated code: `segment` (and its `?` twin),
//! and the values that cross a cut (stashed, shallow-cloned, captured module state).

use std::sync::{Mutex, PoisonError};

use tch::Tensor;

use crate::checkpoint::run;
use crate::{CheckpointOptions, ShallowClone, Shared, Stash};

/// Runs a checkpointed segment; panics with the error's message when it fails (tch's
/// convention for plain calls).
pub fn segment<I, O, F>(options: &CheckpointOptions, name: String, f: F, input: I) -> O
where
    I: Stash,
    O: Stash,
    F: Fn(I) -> O + Send + 'static,
{
    match run(options, name, f, input) {
        Ok(o) => o,
        Err(e) => panic!("{e}"),
    }
}

/// Runs a checkpointed segment whose body uses `?`: `Err` leaves the function with the
/// user's error (which need not be `Clone`: it is handed over once, in forward).
pub fn segment_fallible<I, T, E, F>(
    options: &CheckpointOptions,
    name: String,
    f: F,
    input: I,
) -> Result<T, E>
where
    I: Stash,
    T: Stash,
    E: Send + 'static,
    F: Fn(I) -> Result<T, E> + Send + 'static,
{
    match run(options, name, move |i| Fallible(f(i)), input) {
        Ok(Fallible(r)) => r,
        Err(e) => panic!("{e}"),
    }
}

/// The output of a segment that may exit early with `Err`. An `Err` carries no tensors;
/// its error is moved out of the skeleton by the one `pack` of the forward output (a
/// recompute that fails where forward succeeded is caught by the node's output-count
/// check).
pub struct Fallible<T, E>(pub Result<T, E>);

/// An error kept in a skeleton until forward takes it.
pub struct TakeOnce<E>(Mutex<Option<E>>);

impl<T: Stash, E: Send + 'static> Stash for Fallible<T, E> {
    type Skeleton = Result<T::Skeleton, TakeOnce<E>>;

    fn unpack(self, tensors: &mut Vec<Tensor>) -> Self::Skeleton {
        match self.0 {
            Ok(v) => Ok(v.unpack(tensors)),
            Err(e) => Err(TakeOnce(Mutex::new(Some(e)))),
        }
    }

    fn pack(skeleton: &Self::Skeleton, tensors: &mut std::vec::IntoIter<Tensor>) -> Self {
        Fallible(match skeleton {
            Ok(s) => Ok(T::pack(s, tensors)),
            Err(slot) => Err(slot
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
                .expect("ckpt: the error of a segment is taken once")),
        })
    }
}

/// A value crossing a cut (the macro spans the call on the user's binding, so a missing
/// `Stash` is reported there first; rustc then repeats it for the segment's stash tuple,
/// at the attribute).
pub fn stash<T: Stash>(value: T) -> T {
    value
}

/// A shallow clone of a value that is used inside a segment and after it.
pub fn dup<T: ShallowClone + Stash>(value: &T) -> T {
    value.shallow_clone()
}

/// A shallow clone of the value an `Option<&T>` parameter refers to.
pub fn dup_opt<T: ShallowClone + Stash>(value: Option<&T>) -> Option<T> {
    value.map(T::shallow_clone)
}

/// Shallow clones of a `&[T]` parameter's elements.
pub fn slice_to_vec<T: ShallowClone + Stash>(values: &[T]) -> Vec<T> {
    values.iter().map(T::shallow_clone).collect()
}

/// The one shallow clone of `self` (or of a `&Module` parameter) per call, shared by the
/// segments of the call, and the call's options with its tensors listed
/// ([`CheckpointOptions::parameters_of`]): the segments' nodes take them as inputs.
pub fn capture<T: ShallowClone + Send + 'static>(
    options: CheckpointOptions,
    value: &T,
) -> (CheckpointOptions, Shared<T>) {
    (
        options.parameters_of(value),
        Shared::new(value.shallow_clone()),
    )
}

/// [`capture`] of a `&[T]` parameter of modules (a slice of layers).
pub fn capture_slice<T: ShallowClone + Send + 'static>(
    options: CheckpointOptions,
    value: &[T],
) -> (CheckpointOptions, Shared<Vec<T>>) {
    capture(options, &value.iter().map(T::shallow_clone).collect())
}

/// [`capture`] of an `Option<&T>` module parameter.
pub fn capture_opt<T: ShallowClone + Send + 'static>(
    options: CheckpointOptions,
    value: Option<&T>,
) -> (CheckpointOptions, Option<Shared<T>>) {
    match value {
        Some(v) => {
            let (options, shared) = capture(options, v);
            (options, Some(shared))
        }
        None => (options, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallible_moves_its_error_once() {
        struct NotClone(&'static str);
        let mut tensors = Vec::new();
        let skeleton = Fallible::<Tensor, NotClone>(Err(NotClone("boom"))).unpack(&mut tensors);
        assert!(tensors.is_empty());
        let mut it = tensors.into_iter();
        match Fallible::<Tensor, NotClone>::pack(&skeleton, &mut it).0 {
            Err(NotClone(m)) => assert_eq!(m, "boom"),
            Ok(_) => panic!("expected the error"),
        }
    }
}
