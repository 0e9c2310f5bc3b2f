//! Parsing: the attribute's arguments, the annotated function, the `#[ckpt::allow(..)]`
//! escape hatches and the `ckpt::cut!()` markers. Simple checks (unknown or duplicate
//! keys, values out of range, receivers) happen here; rules spanning several statements
//! are in `analysis/`.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::visit_mut::VisitMut;
use syn::{Attribute, Block, Expr, FnArg, Ident, Pat, Signature, Stmt, Token, Type, Visibility};

use crate::ctxt::Ctxt;

/// The annotated function, kept as syntax so the original can be emitted unchanged on
/// error.
pub(crate) struct Function {
    pub attrs: Vec<Attribute>,
    pub vis: Visibility,
    pub sig: Signature,
    pub block: Box<Block>,
}

/// Parses a function with a body (free function, inherent or trait method, trait default
/// method).
pub(crate) fn parse_function(item: TokenStream) -> syn::Result<Function> {
    let parser = |input: ParseStream| -> syn::Result<Function> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let sig: Signature = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                "`#[checkpointed]` applies to a function or a method with a body",
            )
        })?;
        if input.peek(Token![;]) {
            return Err(syn::Error::new_spanned(
                &sig,
                "`#[checkpointed]` needs a body to cut into segments; put it on the trait method's implementation, not its declaration",
            ));
        }
        let block: Block = input.parse()?;
        Ok(Function {
            attrs,
            vis,
            sig,
            block: Box::new(block),
        })
    };
    parser.parse2(item)
}

/// How a parameter enters a checkpointed segment that uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ParamKind {
    /// Owned value (`xs: Tensor`, `train: bool`, `x: T`): through the stash, moved or
    /// shallow-cloned.
    Owned,
    /// `&T` with `T` tensor data (`&Tensor`, `&Option<Tensor>`, `&Vec<..>`, tuples,
    /// arrays, numbers, recurrent states): a shallow clone through the stash, rebound as
    /// `&T` inside.
    RefData,
    /// `&[T]`: a `Vec<T>` of shallow clones through the stash, rebound as `&[T]`.
    RefSlice,
    /// `&str`: a `String` through the stash, rebound as `&str`.
    RefStr,
    /// `Option<&T>` with `T` tensor data (tch's usual mask argument): an `Option<T>` of a
    /// shallow clone through the stash, rebound as `Option<&T>`.
    OptRefData,
    /// `impl Borrow<T>` (`T` tensor data): a shallow clone of the borrowed value through
    /// the stash, rebound as `&T` (which is `Borrow<T>` too).
    Borrowed,
    /// `&T` with any other `T` (a module): captured by one `ShallowClone` per call,
    /// shared by the segments through `ckpt::Shared`.
    Capture,
    /// `Option<&T>` with a module `T`: captured as [`ParamKind::Capture`] when present.
    OptCapture,
    /// `&[T]` with a module `T` (a slice of layers): one `ShallowClone` of each per call,
    /// shared by the segments, rebound as `&[T]`.
    CaptureSlice,
    /// `&mut T`: cannot enter a checkpointed segment.
    RefMut,
}

impl ParamKind {
    /// Whether the parameter refers to data that crosses a cut as a shallow clone and is
    /// rebound as a reference on the other side.
    pub(crate) fn by_ref(self) -> bool {
        matches!(
            self,
            ParamKind::RefData
                | ParamKind::RefSlice
                | ParamKind::RefStr
                | ParamKind::OptRefData
                | ParamKind::Borrowed
        )
    }

    /// Whether the parameter is module state, captured like `self`.
    pub(crate) fn captured(self) -> bool {
        matches!(
            self,
            ParamKind::Capture | ParamKind::OptCapture | ParamKind::CaptureSlice
        )
    }
}

/// Type names that `&T` parameters go through the stash for (tensor data, and recurrent
/// states, which carry the autograd history of the call); other `&T` are captured as
/// module state.
const DATA_TYPES: &[&str] = &[
    "Tensor",
    "Option",
    "Vec",
    "Box",
    "Kind",
    "Device",
    "String",
    "bool",
    "char",
    "i8",
    "i16",
    "i32",
    "i64",
    "i128",
    "isize",
    "u8",
    "u16",
    "u32",
    "u64",
    "u128",
    "usize",
    "f32",
    "f64",
    "GRUState",
    "LSTMState",
];

/// Whether `ty` (a referent) is tensor data rather than module state.
fn is_data(ty: &Type) -> bool {
    match ty {
        Type::Path(p) if p.qself.is_none() => p
            .path
            .segments
            .last()
            .is_some_and(|last| DATA_TYPES.iter().any(|t| last.ident == t)),
        Type::Tuple(_) | Type::Array(_) | Type::Slice(_) => true,
        Type::Paren(p) => is_data(&p.elem),
        _ => false,
    }
}

/// The `T` of `Option<&T>` (immutable reference), if `ty` is one.
fn option_of_ref(ty: &Type) -> Option<&Type> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if p.qself.is_some() || last.ident != "Option" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.first()? {
        syn::GenericArgument::Type(Type::Reference(r)) if r.mutability.is_none() => Some(&r.elem),
        _ => None,
    }
}

/// Whether `ty` is `impl Borrow<..>`.
fn is_impl_borrow(ty: &Type) -> bool {
    let Type::ImplTrait(it) = ty else {
        return false;
    };
    it.bounds.iter().any(|b| {
        matches!(b, syn::TypeParamBound::Trait(t)
            if t.path.segments.last().is_some_and(|s| s.ident == "Borrow"))
    })
}

/// Classifies a parameter by the syntax of its type (the macro has no type information).
pub(crate) fn param_kind(pat: &Pat, ty: &Type) -> ParamKind {
    if !matches!(pat, Pat::Ident(_)) {
        return match ty {
            Type::Reference(r) if r.mutability.is_some() => ParamKind::RefMut,
            _ => ParamKind::Owned,
        };
    }
    if let Some(inner) = option_of_ref(ty) {
        return if is_data(inner) {
            ParamKind::OptRefData
        } else {
            ParamKind::OptCapture
        };
    }
    if is_impl_borrow(ty) {
        return ParamKind::Borrowed;
    }
    let Type::Reference(r) = ty else {
        return ParamKind::Owned;
    };
    if r.mutability.is_some() {
        return ParamKind::RefMut;
    }
    match &*r.elem {
        Type::Slice(slice) if is_data(&slice.elem) => ParamKind::RefSlice,
        Type::Slice(_) => ParamKind::CaptureSlice,
        Type::Path(p) if p.qself.is_none() && p.path.is_ident("str") => ParamKind::RefStr,
        elem if is_data(elem) => ParamKind::RefData,
        Type::Paren(p) => param_kind(
            pat,
            &Type::Reference(syn::TypeReference {
                elem: p.elem.clone(),
                ..r.clone()
            }),
        ),
        _ => ParamKind::Capture,
    }
}

/// Checks the signature: `async`, `&mut self` and by-value `self` receivers are errors.
/// Returns the span of `self` when the receiver is `&self`.
pub(crate) fn check_signature(sig: &Signature, cx: &mut Ctxt) -> Option<Span> {
    if let Some(a) = &sig.asyncness {
        cx.error_spanned_by(
            a,
            "`#[checkpointed]` cannot cut an `async fn`: a segment is replayed in backward, outside any executor; make the function synchronous",
        );
    }
    let receiver = sig.inputs.iter().find_map(|arg| match arg {
        FnArg::Receiver(r) => Some(r),
        FnArg::Typed(_) => None,
    })?;
    let is_ref_self = match (&receiver.reference, receiver.colon_token) {
        (Some(_), None) => receiver.mutability.is_none(),
        (None, Some(_)) => matches!(&*receiver.ty, Type::Reference(r)
            if r.mutability.is_none() && matches!(&*r.elem, Type::Path(p) if p.path.is_ident("Self"))),
        _ => false,
    };
    let is_mut = receiver.mutability.is_some()
        || matches!(&*receiver.ty, Type::Reference(r) if r.mutability.is_some());
    if is_ref_self {
        Some(receiver.self_token.span)
    } else {
        if is_mut {
            cx.error_spanned_by(
                receiver,
                "`#[checkpointed]` needs `&self`, not `&mut self`: a segment runs again in backward, so it must not mutate `self`; take `&self` and keep mutation outside the checkpointed function",
            );
        } else {
            cx.error_spanned_by(
                receiver,
                "`#[checkpointed]` needs `&self`: a method taking `self` by value moves it into the first segment; take `&self`",
            );
        }
        None
    }
}

/// The side-effect rules, by the name used in `#[ckpt::allow(..)]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Rule {
    /// Assignment or compound assignment to a place not bound inside the segment.
    Assign,
    /// In-place tensor op (`*_`, `f_*_`) on a value that enters the segment, or on `self`.
    Inplace,
    /// `println!`, `print!`, `eprintln!`, `eprint!`, `dbg!`, `write!`, `writeln!`.
    Io,
    /// `unsafe` blocks.
    Unsafe,
    /// Interior mutability or collection mutation on a value from outside the segment.
    Mutation,
    /// Randomness outside libtorch (`rand::`, `thread_rng`).
    Rng,
}

impl Rule {
    pub(crate) const ALL: [Rule; 6] = [
        Rule::Assign,
        Rule::Inplace,
        Rule::Io,
        Rule::Unsafe,
        Rule::Mutation,
        Rule::Rng,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Rule::Assign => "assign",
            Rule::Inplace => "inplace",
            Rule::Io => "io",
            Rule::Unsafe => "unsafe",
            Rule::Mutation => "mutation",
            Rule::Rng => "rng",
        }
    }

    fn from_name(name: &str) -> Option<Rule> {
        Rule::ALL.into_iter().find(|r| r.name() == name)
    }
}

fn is_ckpt_path(path: &syn::Path, last: &str) -> bool {
    path.segments.len() == 2 && path.segments[0].ident == "ckpt" && path.segments[1].ident == last
}

/// Whether `attr` is `#[ckpt::allow(..)]`.
pub(crate) fn is_allow_attr(attr: &Attribute) -> bool {
    is_ckpt_path(attr.path(), "allow")
}

/// Whether `attr` is `#[ckpt::keep]`.
pub(crate) fn is_keep_attr(attr: &Attribute) -> bool {
    is_ckpt_path(attr.path(), "keep")
}

/// Takes the `#[ckpt::keep]` marks out of a top-level statement: whether it had one (on a
/// `let`; anywhere else, or with arguments, it is an error naming the fix). Marks nested
/// deeper in the statement are errors too: a kept statement is a top-level `let` of the
/// body.
pub(crate) fn take_keep(stmt: &mut Stmt, cx: &mut Ctxt) -> bool {
    struct Nested<'a> {
        cx: &'a mut Ctxt,
    }
    impl VisitMut for Nested<'_> {
        fn visit_local_mut(&mut self, l: &mut syn::Local) {
            self.check(&mut l.attrs);
            syn::visit_mut::visit_local_mut(self, l);
        }
        fn visit_stmt_macro_mut(&mut self, m: &mut syn::StmtMacro) {
            self.check(&mut m.attrs);
            syn::visit_mut::visit_stmt_macro_mut(self, m);
        }
        fn visit_expr_mut(&mut self, e: &mut Expr) {
            if let Some(attrs) = expr_attrs_mut(e) {
                self.check(attrs);
            }
            syn::visit_mut::visit_expr_mut(self, e);
        }
        fn visit_item_mut(&mut self, _: &mut syn::Item) {}
    }
    impl Nested<'_> {
        fn check(&mut self, attrs: &mut Vec<Attribute>) {
            for attr in attrs.iter().filter(|a| is_keep_attr(a)) {
                self.cx.error_spanned_by(
                    attr,
                    "`#[ckpt::keep]` marks a top-level `let` of the function body, whose statement then runs once, between the checkpointed segments; move it to such a `let`, or remove it",
                );
            }
            attrs.retain(|a| !is_keep_attr(a));
        }
    }
    let mut kept = false;
    if let Stmt::Local(local) = stmt {
        for attr in local.attrs.iter().filter(|a| is_keep_attr(a)) {
            if !matches!(attr.meta, syn::Meta::Path(_)) {
                cx.error_spanned_by(
                    attr,
                    "`#[ckpt::keep]` takes no arguments: write `#[ckpt::keep] let x = ..;`",
                );
            }
            kept = true;
        }
        local.attrs.retain(|a| !is_keep_attr(a));
    }
    Nested { cx }.visit_stmt_mut(stmt);
    kept
}

/// The rules a statement's `#[ckpt::allow(..)]` attributes name; unknown names are errors
/// listing the valid ones.
pub(crate) fn allowed_rules(attrs: &[&Attribute], cx: &mut Ctxt) -> Vec<Rule> {
    let mut rules = Vec::new();
    for attr in attrs.iter().copied().filter(|a| is_allow_attr(a)) {
        let names = attr.parse_args_with(|input: ParseStream| {
            Punctuated::<Ident, Token![,]>::parse_terminated_with(input, Ident::parse_any)
        });
        match names {
            Ok(names) if names.is_empty() => cx.error_spanned_by(
                attr,
                format!(
                    "`#[ckpt::allow(..)]` names the rules it lifts: {}",
                    rule_list()
                ),
            ),
            Ok(names) => {
                for name in names {
                    match Rule::from_name(&name.to_string()) {
                        Some(rule) => rules.push(rule),
                        None => cx.error_spanned_by(
                            &name,
                            format!(
                                "unknown rule `{name}` in `#[ckpt::allow]`; expected one of {}",
                                rule_list()
                            ),
                        ),
                    }
                }
            }
            Err(_) => cx.error_spanned_by(
                attr,
                format!(
                    "expected `#[ckpt::allow(rule, ..)]` with rules among {}",
                    rule_list()
                ),
            ),
        }
    }
    rules
}

fn rule_list() -> String {
    Rule::ALL
        .iter()
        .map(|r| format!("`{}`", r.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether a statement is a `ckpt::cut!()` marker.
pub(crate) fn as_cut_marker(stmt: &Stmt) -> Option<&syn::Macro> {
    match stmt {
        Stmt::Macro(m) if is_cut_macro(&m.mac) => Some(&m.mac),
        Stmt::Expr(Expr::Macro(m), _) if is_cut_macro(&m.mac) => Some(&m.mac),
        _ => None,
    }
}

/// Whether a macro invocation is `ckpt::cut!` (or `::ckpt::cut!`).
pub(crate) fn is_cut_macro(mac: &syn::Macro) -> bool {
    is_ckpt_path(&mac.path, "cut")
}

/// The attributes of an expression (shared by all `Expr` variants).
pub(crate) fn expr_attrs(expr: &Expr) -> &[Attribute] {
    macro_rules! pick {
        ($($v:ident)*) => {
            match expr {
                $(Expr::$v(e) => &e.attrs,)*
                _ => &[],
            }
        };
    }
    pick!(Array Assign Async Await Binary Block Break Call Cast Closure Const Continue Field
        ForLoop Group If Index Infer Let Lit Loop Macro Match MethodCall Paren Path Range RawAddr
        Reference Repeat Return Struct Try TryBlock Tuple Unary Unsafe While Yield)
}

fn expr_attrs_mut(expr: &mut Expr) -> Option<&mut Vec<Attribute>> {
    macro_rules! pick {
        ($($v:ident)*) => {
            match expr {
                $(Expr::$v(e) => Some(&mut e.attrs),)*
                _ => None,
            }
        };
    }
    pick!(Array Assign Async Await Binary Block Break Call Cast Closure Const Continue Field
        ForLoop Group If Index Infer Let Lit Loop Macro Match MethodCall Paren Path Range RawAddr
        Reference Repeat Return Struct Try TryBlock Tuple Unary Unsafe While Yield)
}

/// The attributes of a statement (where `#[ckpt::allow(..)]` goes). For an expression
/// statement, syn attaches outer attributes to the leftmost operand (`#[a] x += 1` puts
/// `#[a]` on `x`), so the attributes along the leftmost spine are collected.
pub(crate) fn stmt_attrs(stmt: &Stmt) -> Vec<&Attribute> {
    match stmt {
        Stmt::Local(l) => l.attrs.iter().collect(),
        Stmt::Macro(m) => m.attrs.iter().collect(),
        Stmt::Expr(e, _) => {
            let mut attrs = Vec::new();
            let mut e = e;
            loop {
                attrs.extend(expr_attrs(e));
                e = match e {
                    Expr::Assign(x) => &x.left,
                    Expr::Binary(x) => &x.left,
                    Expr::MethodCall(x) => &x.receiver,
                    Expr::Field(x) => &x.base,
                    Expr::Index(x) => &x.expr,
                    Expr::Call(x) => &x.func,
                    Expr::Cast(x) => &x.expr,
                    Expr::Try(x) => &x.expr,
                    Expr::Await(x) => &x.base,
                    Expr::Range(syn::ExprRange { start: Some(x), .. }) => x,
                    _ => break,
                };
            }
            attrs
        }
        Stmt::Item(_) => Vec::new(),
    }
}

/// Removes every `#[ckpt::allow(..)]` and `#[ckpt::keep]` from a statement, at any depth:
/// they are markers for this macro, and rustc would reject them as custom attributes on
/// statements.
pub(crate) fn strip_marker_attrs(stmt: &mut Stmt) {
    fn is_marker(a: &Attribute) -> bool {
        is_allow_attr(a) || is_keep_attr(a)
    }
    struct Strip;
    impl VisitMut for Strip {
        fn visit_local_mut(&mut self, l: &mut syn::Local) {
            l.attrs.retain(|a| !is_marker(a));
            syn::visit_mut::visit_local_mut(self, l);
        }
        fn visit_stmt_macro_mut(&mut self, m: &mut syn::StmtMacro) {
            m.attrs.retain(|a| !is_marker(a));
            syn::visit_mut::visit_stmt_macro_mut(self, m);
        }
        fn visit_expr_mut(&mut self, e: &mut Expr) {
            if let Some(attrs) = expr_attrs_mut(e) {
                attrs.retain(|a| !is_marker(a));
            }
            syn::visit_mut::visit_expr_mut(self, e);
        }
        fn visit_item_mut(&mut self, _: &mut syn::Item) {}
    }
    Strip.visit_stmt_mut(stmt);
}
