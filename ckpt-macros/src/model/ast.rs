//! The parsed form of a `model!` declaration. It keeps the user's syntax (identifiers,
//! types, expressions, closures) so that the expansion can put the user's spans on the
//! generated code and errors can point at the offending tokens.

use proc_macro2::Span;
use syn::{Attribute, Expr, ExprClosure, Generics, Ident, Pat, Path, Type, Visibility};

use crate::args::Schedule;

/// One `model! { .. }` invocation.
pub(crate) struct Model {
    /// Outer attributes of the struct (doc comments, `#[allow]`, ..), less
    /// `#[checkpointed]`.
    pub attrs: Vec<Attribute>,
    /// `#[checkpointed(..)]`, when present and valid.
    pub checkpoint: Option<Checkpoint>,
    /// Whether `#[checkpointed]` is present (valid or not): the stubs emitted next to
    /// errors then include the schedule methods.
    pub checkpointed: bool,
    pub vis: Visibility,
    pub ident: Ident,
    /// Generics and `where` clause of the struct.
    pub generics: Generics,
    /// The constructor's `nn::Path` parameter (first in the parameter list).
    pub path: PathParam,
    /// The constructor's other parameters, as written (`cfg: &Config`).
    pub params: Vec<Param>,
    /// The items between the braces, in order.
    pub items: Vec<Item>,
    /// One entry per item: where its `#[keep]` is, for stages marked to be stored rather
    /// than recomputed (always `None` for per-call values and `#[field]`s, which are
    /// reported).
    pub keeps: Vec<Option<Span>>,
}

impl Model {
    /// The stages marked `#[keep]`, with their items' indices.
    pub(crate) fn kept(&self) -> impl Iterator<Item = (usize, &Item, Span)> {
        self.items
            .iter()
            .zip(&self.keeps)
            .enumerate()
            .filter_map(|(k, (item, keep))| keep.map(|span| (k, item, span)))
    }
}

/// The path parameter: `p` or `p: &nn::Path`.
pub(crate) struct PathParam {
    pub ident: Ident,
    pub ty: Option<Type>,
}

/// A constructor parameter `pat: Type`.
pub(crate) struct Param {
    pub pat: Pat,
    pub ty: Type,
}

/// The arguments of `#[checkpointed(..)]`.
pub(crate) struct Checkpoint {
    /// The schedule the model starts with (`ckpt::plan::Schedule`; the generated
    /// `set_schedule` changes it at run time).
    pub schedule: Schedule,
    pub preserve_rng_state: Option<bool>,
    pub determinism_check: Option<bool>,
    pub policy: Option<crate::args::PolicyArg>,
}

/// An item of the declaration.
pub(crate) enum Item {
    /// `let name: Type = expr` — a per-call value.
    Let(Box<LetItem>),
    /// `name: Type = init`, `name: [Type; count] = init`, `#[field] name: Type = init`.
    Field(Box<FieldItem>),
    /// `relu`, `gelu`, `tanh`, `sigmoid`, `silu`, `dropout(p)`.
    Builtin(BuiltinItem),
    /// A path to a function on a tensor (`my_fn`, `Tensor::relu`).
    Function(FunctionItem),
    /// `|xs| ..` or `|xs, train| ..`.
    Closure(ClosureItem),
}

impl Item {
    /// Whether the item is a stage of the chain (per-call values and `#[field]`s are not).
    pub(crate) fn is_stage(&self) -> bool {
        match self {
            Item::Let(_) => false,
            Item::Field(f) => !matches!(f.kind, FieldKind::Plain),
            Item::Builtin(_) | Item::Function(_) | Item::Closure(_) => true,
        }
    }

    /// Whether the stage takes the train flag.
    pub(crate) fn needs_train(&self) -> bool {
        match self {
            Item::Let(l) => l.uses_train,
            Item::Field(f) => {
                f.train.is_some() || f.apply.as_ref().is_some_and(|c| c.inputs.len() == 3)
            }
            Item::Builtin(b) => b.kind == Builtin::Dropout,
            Item::Function(f) => f.train.is_some(),
            Item::Closure(c) => c.closure.inputs.len() == 2,
        }
    }
}

/// `let name: Type = expr`.
pub(crate) struct LetItem {
    pub ident: Ident,
    pub ty: Type,
    pub expr: Expr,
    /// Whether `expr` mentions `train` (then the model takes the train flag).
    pub uses_train: bool,
}

/// A named item: a field of the struct.
pub(crate) struct FieldItem {
    /// Doc comments.
    pub docs: Vec<Attribute>,
    pub vis: Visibility,
    pub ident: Ident,
    /// The type as written (`nn::Linear`, `[Block; cfg.layers]`).
    pub ty: Type,
    pub kind: FieldKind,
    /// The constructor expression; `None` when missing (an error; the field is still
    /// declared so that the rest of the program type-checks).
    pub init: Option<Expr>,
    /// `#[train]`: applied with `ModuleT::forward_t`.
    pub train: Option<Span>,
    /// `=> |layer, xs| ..` or `=> |layer, xs, train| ..`: how the stage is applied.
    pub apply: Option<ExprClosure>,
}

/// What a named item is.
pub(crate) enum FieldKind {
    /// A layer stage: field of the written type, built under `p / "name"`.
    Layer,
    /// A repeated stage `[elem; count]`: a `Vec<elem>` field, built `count` times under
    /// `p / "name" / i`.
    Repeated { elem: Box<Type>, count: Box<Expr> },
    /// `#[field]`: a field that is not a stage, built with the model's own path.
    Plain,
}

impl FieldItem {
    /// The type of the struct field.
    pub(crate) fn field_type(&self) -> Type {
        match &self.kind {
            FieldKind::Repeated { elem, .. } => syn::parse_quote!(::std::vec::Vec<#elem>),
            FieldKind::Layer | FieldKind::Plain => self.ty.clone(),
        }
    }
}

/// A built-in functional stage.
pub(crate) struct BuiltinItem {
    /// The name as written (for spans).
    pub ident: Ident,
    pub kind: Builtin,
    /// The argument of `dropout(p)`.
    pub arg: Option<Expr>,
}

/// The built-in functional stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Builtin {
    Relu,
    Gelu,
    Tanh,
    Sigmoid,
    Silu,
    Dropout,
}

impl Builtin {
    pub(crate) const ALL: [Builtin; 6] = [
        Builtin::Relu,
        Builtin::Gelu,
        Builtin::Tanh,
        Builtin::Sigmoid,
        Builtin::Silu,
        Builtin::Dropout,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Builtin::Relu => "relu",
            Builtin::Gelu => "gelu",
            Builtin::Tanh => "tanh",
            Builtin::Sigmoid => "sigmoid",
            Builtin::Silu => "silu",
            Builtin::Dropout => "dropout",
        }
    }

    pub(crate) fn from_ident(ident: &Ident) -> Option<Builtin> {
        Builtin::ALL.into_iter().find(|b| ident == b.name())
    }

    /// How it is written in a declaration.
    pub(crate) fn usage(self) -> &'static str {
        match self {
            Builtin::Dropout => "dropout(p)",
            other => other.name(),
        }
    }
}

/// A function stage.
pub(crate) struct FunctionItem {
    pub path: Path,
    /// `#[train]`: called as `f(&xs, train)`.
    pub train: Option<Span>,
}

/// A closure stage.
pub(crate) struct ClosureItem {
    pub closure: ExprClosure,
}
