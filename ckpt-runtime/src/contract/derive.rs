//! What `#[derive(ShallowClone)]` (and `model!`'s generated impls) call: autoref
//! specialization that copies and visits a field by what its type implements.

use tch::Tensor;

use crate::ShallowClone;

/// Autoref specialization for `#[derive(ShallowClone)]`: `(&&&Dup(&field)).__ckpt_dup()`
/// is a shallow clone when the field's type implements `ShallowClone`, else a `Clone`,
/// else a compile error from [`FieldCopy`] that names the field and the fix.
pub struct Dup<'a, T>(pub &'a T);

/// Picked first, when `T: ShallowClone`.
pub trait ViaShallowClone<T> {
    /// The copy.
    fn __ckpt_dup(&self) -> T;
}

impl<T: ShallowClone> ViaShallowClone<T> for &&Dup<'_, T> {
    fn __ckpt_dup(&self) -> T {
        self.0.shallow_clone()
    }
}

/// `ShallowClone::visit_tensors` of a derived struct's field, dispatched as [`Dup`]'s
/// copy is: the field's tensors when it is `ShallowClone`, none when it is only `Clone`.
pub struct Visit<'a, T>(pub &'a T);

/// Picked first, when `T: ShallowClone`.
pub trait VisitShallowClone {
    /// Visits the field's tensors.
    fn __ckpt_visit(&self, f: &mut dyn FnMut(&Tensor));
}

impl<T: ShallowClone> VisitShallowClone for &Visit<'_, T> {
    fn __ckpt_visit(&self, f: &mut dyn FnMut(&Tensor)) {
        self.0.visit_tensors(f)
    }
}

/// Picked otherwise: a `Clone` field (configuration) holds no tensors `ckpt` can see;
/// a field that is neither is reported by the copy ([`FieldCopy`]), once.
pub trait VisitOther {
    /// Visits nothing.
    fn __ckpt_visit(&self, f: &mut dyn FnMut(&Tensor));
}

impl<T> VisitOther for Visit<'_, T> {
    fn __ckpt_visit(&self, _f: &mut dyn FnMut(&Tensor)) {}
}

/// Picked next, when `T: Clone`.
pub trait ViaClone<T> {
    /// The copy.
    fn __ckpt_dup(&self) -> T;
}

impl<T: Clone> ViaClone<T> for &Dup<'_, T> {
    fn __ckpt_dup(&self) -> T {
        self.0.clone()
    }
}

/// Picked last, when the field's type is neither: its bound [`FieldCopy`] fails with a
/// message about the user's field.
pub trait ViaNeither<T> {
    /// The copy (never compiles: no type reaching here implements [`FieldCopy`]).
    fn __ckpt_dup(&self) -> T
    where
        T: FieldCopy;
}

impl<T> ViaNeither<T> for Dup<'_, T> {
    fn __ckpt_dup(&self) -> T
    where
        T: FieldCopy,
    {
        self.0.field_copy()
    }
}

/// Implemented for no type: the bound whose failure reports a derived struct's field
/// that is neither `ShallowClone` nor `Clone`.
#[diagnostic::on_unimplemented(
    message = "field of type `{Self}` is not `ckpt::ShallowClone` (nor `Clone`): a checkpointed segment cannot copy it",
    label = "this field's type implements neither `ckpt::ShallowClone` nor `Clone`",
    note = "wrap the field in `ckpt::Shared<{Self}>`: the segments share it through an `Arc`, and it implements `tch::nn::ModuleT` when `{Self}` does (closure-built modules: `nn::FuncT`, `nn::SequentialT`)",
    note = "or derive `ckpt::ShallowClone` for `{Self}` if it is your type, or implement `ckpt::ShallowClone` for it by hand"
)]
pub trait FieldCopy {
    /// Unused.
    fn field_copy(&self) -> Self;
}
