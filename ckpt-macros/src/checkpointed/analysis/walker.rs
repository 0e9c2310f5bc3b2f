//! The scope-aware walker of one group of statements: what the group uses and defines
//! (for liveness), where it can leave early (`?`), and, as it goes, the side-effect rules
//! (`rules.rs`) on every expression, following locals to what they alias (`alias.rs`).
//!
//! A *use* is a single-identifier path expression not bound by an enclosing scope inside
//! the group (block, closure parameter, match arm, `if let`, `for`), an identifier inside
//! a macro invocation whose arguments are not expressions (conservatively), or a `{name}`
//! captured by a format string.

use std::collections::{HashMap, HashSet};

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{Expr, Pat, Stmt, Token};

use super::alias::{Alias, AliasKind};
use super::names::EARLY_EXIT_MACROS;
use super::{Binding, pat_bindings};
use crate::checkpointed::body;
use crate::checkpointed::parse::{self, ParamKind, Rule};
use crate::ctxt::Ctxt;

/// What a walk over a group found.
pub(super) struct Walk {
    /// Names used before any definition in the group, with their first span, in order.
    pub(super) uses: Vec<(String, Span)>,
    /// Top-level definitions, in order (shadowed ones included).
    pub(super) defs: Vec<Binding>,
    /// The first `?` at the top level of the segment (not inside a closure).
    pub(super) fallible: Option<Span>,
    /// Outer bindings the group assigns or mutates (function-local values, or others with
    /// an escape hatch or in the inline group): they leave the group as outputs, so the
    /// change is seen after it.
    pub(super) mutated: Vec<String>,
    /// The last top-level definition of each name, when it holds a reference to data.
    pub(super) ref_defs: HashMap<String, ParamKind>,
    /// Top-level definitions that refer to module state (`let lin = &self.head;`), which
    /// cannot cross a cut, with the initializer's text.
    pub(super) module_defs: HashMap<String, String>,
}

/// The scope-aware walker of one group.
pub(super) struct Walker<'c> {
    /// Where rule violations go.
    pub(super) cx: &'c mut Ctxt,
    /// Whether the rules of a segment apply (a group that is a closure of its own;
    /// [`Walker::once`] lifts the side-effect ones).
    pub(super) check: bool,
    /// "segment 2 of 3", for messages.
    pub(super) segment: String,
    /// The function's name, for messages.
    pub(super) fn_name: &'c str,
    /// Innermost last; `scopes[0]` holds the group's top-level definitions so far. Each
    /// local maps to what it aliases when that is a value from outside the segment
    /// (`let s = &self.x;`, `let t = x.shallow_clone();`, `let u = x;`, the parameter of
    /// a closure given to a method of an outside value, `TL.with(|c| ..)`): the
    /// side-effect rules follow it there.
    pub(super) scopes: Vec<HashMap<String, Option<Alias>>>,
    /// What the parameters of the closure about to be visited alias.
    pub(super) closure_alias: Option<Alias>,
    /// [`Walk::uses`].
    pub(super) uses: Vec<(String, Span)>,
    /// The names in `uses`.
    pub(super) seen: HashSet<String>,
    /// [`Walk::defs`].
    pub(super) defs: Vec<Binding>,
    /// [`Walk::fallible`].
    pub(super) fallible: Option<Span>,
    /// [`Walk::mutated`].
    pub(super) mutated: Vec<String>,
    /// Rules lifted by `#[ckpt::allow(..)]` on the enclosing statements.
    pub(super) allowed: Vec<Rule>,
    /// Closure / async-block nesting: `return` and `?` there belong to it.
    pub(super) closure_depth: usize,
    /// Enclosing loops and labeled blocks of the current closure level: (label, is_loop).
    pub(super) loops: Vec<(Option<String>, bool)>,
    /// The cuts are chosen at run time (`segments = auto`, `budget`, a layer loop): every
    /// statement but the last is a stage (messages differ).
    pub(super) runtime: bool,
    /// The whole function is the segment: `return` leaves it as it leaves the function.
    pub(super) whole: bool,
    /// The group is a closure that runs once (a `#[ckpt::keep]` unit of a run-time
    /// chain): the side-effect rules ([`Walker::violation`]) do not apply, the structural
    /// ones (control flow leaving it) do.
    pub(super) once: bool,
    /// The group is a `#[ckpt::keep]` unit of a chain the planner profiles: backward
    /// does not recompute it, but the profile runs it again, so the side-effect rules
    /// apply, and their messages say why.
    pub(super) kept_profiled: bool,
    /// The bindings of the function defined before this group (parameters and top-level
    /// `let`s), with the kind of the parameters and reference `let`s among them.
    pub(super) outer: HashMap<String, Option<ParamKind>>,
    /// Top-level `let`s of this group that hold a reference to data, with how they
    /// cross a cut (`let r = xs;` of a `&Tensor` parameter, `let r = &h;`).
    pub(super) ref_defs: HashMap<String, ParamKind>,
    /// Top-level `let`s of this group that refer to module state.
    pub(super) module_defs: HashMap<String, String>,
}

impl<'c> Walker<'c> {
    /// A walker of a group labelled `segment` in messages ("segment 2 of 3"); `check`:
    /// whether the rules of a segment apply (a group that is a closure of its own).
    pub(super) fn new(cx: &'c mut Ctxt, check: bool, segment: String, fn_name: &'c str) -> Self {
        Walker {
            cx,
            check,
            segment,
            fn_name,
            scopes: vec![HashMap::new()],
            closure_alias: None,
            uses: Vec::new(),
            seen: HashSet::new(),
            defs: Vec::new(),
            fallible: None,
            mutated: Vec::new(),
            allowed: Vec::new(),
            closure_depth: 0,
            loops: Vec::new(),
            runtime: false,
            whole: false,
            once: false,
            kept_profiled: false,
            outer: HashMap::new(),
            ref_defs: HashMap::new(),
            module_defs: HashMap::new(),
        }
    }

    /// What the walk found.
    pub(super) fn finish(self) -> Walk {
        Walk {
            uses: self.uses,
            defs: self.defs,
            fallible: self.fallible,
            mutated: self.mutated,
            ref_defs: self.ref_defs,
            module_defs: self.module_defs,
        }
    }

    /// Whether `name` is bound inside the group (in any enclosing scope).
    pub(super) fn is_local(&self, name: &str) -> bool {
        self.scopes.iter().any(|s| s.contains_key(name))
    }

    /// Records a use of `name`, unless it is bound inside the group or already used.
    pub(super) fn use_name(&mut self, name: String, span: Span) {
        if !self.is_local(&name) && self.seen.insert(name.clone()) {
            self.uses.push((name, span));
        }
    }

    /// Binds the names of `pat` in the innermost scope, aliasing nothing.
    pub(super) fn bind(&mut self, pat: &Pat) {
        let mut bs = Vec::new();
        pat_bindings(pat, &mut bs);
        let scope = self.scopes.last_mut().expect("a scope");
        scope.extend(bs.into_iter().map(|b| (b.ident.to_string(), None)));
    }

    /// Runs `f` in a new innermost scope.
    pub(super) fn scoped(&mut self, f: impl FnOnce(&mut Self)) {
        self.scopes.push(HashMap::new());
        f(self);
        self.scopes.pop();
    }

    /// Runs `f` inside a closure or async block: its own scope, loops and `?`.
    pub(super) fn in_closure(&mut self, f: impl FnOnce(&mut Self)) {
        let loops = std::mem::take(&mut self.loops);
        self.closure_depth += 1;
        self.scoped(f);
        self.closure_depth -= 1;
        self.loops = loops;
    }

    /// Runs `f` with the rules lifted by the `#[ckpt::allow(..)]` among `attrs`.
    pub(super) fn with_allow(&mut self, attrs: &[&syn::Attribute], f: impl FnOnce(&mut Self)) {
        let rules = parse::allowed_rules(attrs, self.cx);
        let n = self.allowed.len();
        self.allowed.extend(rules);
        f(self);
        self.allowed.truncate(n);
    }

    /// Binds a `let` pattern in the innermost scope (or, `top`, in the group's), with
    /// the alias its initializer makes when the pattern is one name.
    pub(super) fn bind_let(&mut self, pat: &Pat, init: Option<&Expr>, top: bool) {
        let alias = init.and_then(|e| self.alias_target(e));
        let mut bs = Vec::new();
        pat_bindings(pat, &mut bs);
        let alias = match (&bs[..], alias) {
            ([b], Some(a)) => Some(Alias {
                mutable: b.mutable,
                ..a
            }),
            _ => None,
        };
        if top {
            let reference = match (&bs[..], init) {
                ([b], Some(e)) if !b.mutable => self.ref_kind_of(e),
                _ => None,
            };
            let module = match (&bs[..], init) {
                ([_], Some(e)) if self.module_ref(e) => Some(body::short_text(e, 40)),
                _ => None,
            };
            for b in &bs {
                match reference {
                    Some(kind) => self.ref_defs.insert(b.ident.to_string(), kind),
                    None => self.ref_defs.remove(&b.ident.to_string()),
                };
                match &module {
                    Some(text) => self.module_defs.insert(b.ident.to_string(), text.clone()),
                    None => self.module_defs.remove(&b.ident.to_string()),
                };
            }
        }
        let scope = if top {
            &mut self.scopes[0]
        } else {
            self.scopes.last_mut().expect("a scope")
        };
        for b in &bs {
            scope.insert(b.ident.to_string(), alias.clone());
        }
        if top {
            self.defs.extend(bs);
        }
    }

    /// A statement; `top`: one of the group's own (not nested), whose bindings are the
    /// group's definitions.
    pub(super) fn walk_stmt(&mut self, stmt: &Stmt, top: bool) {
        self.with_allow(&parse::stmt_attrs(stmt), |w| match stmt {
            Stmt::Local(local) => {
                if let Some(init) = &local.init {
                    w.visit_expr(&init.expr);
                    if let Some((_, diverge)) = &init.diverge {
                        w.visit_expr(diverge);
                    }
                }
                w.bind_let(&local.pat, local.init.as_ref().map(|i| &*i.expr), top);
            }
            Stmt::Expr(e, _) => w.visit_expr(e),
            Stmt::Macro(m) => w.visit_macro(&m.mac),
            Stmt::Item(_) => {}
        });
    }

    /// Conservative uses inside a macro's tokens: identifiers (not after `.`, not before
    /// `::`), `self`, and format-string captures.
    pub(super) fn scan_tokens(&mut self, tokens: TokenStream, idents: bool) {
        let tts: Vec<TokenTree> = tokens.into_iter().collect();
        for (i, tt) in tts.iter().enumerate() {
            match tt {
                TokenTree::Ident(id) if idents => {
                    let after_dot =
                        i > 0 && matches!(&tts[i - 1], TokenTree::Punct(p) if p.as_char() == '.');
                    let before_path =
                        matches!(tts.get(i + 1), Some(TokenTree::Punct(p)) if p.as_char() == ':');
                    if !after_dot && !before_path {
                        self.use_name(id.to_string(), id.span());
                    }
                }
                TokenTree::Group(g) => self.scan_tokens(g.stream(), idents),
                TokenTree::Literal(lit) => {
                    for name in format_captures(&lit.to_string()) {
                        self.use_name(name, lit.span());
                    }
                }
                _ => {}
            }
        }
    }
}

/// Identifiers captured by a format string literal: `"{x}"`, `"{x:?}"` (not `"{{x}}"`).
pub(super) fn format_captures(lit: &str) -> Vec<String> {
    if !(lit.starts_with('"') || lit.starts_with('r')) {
        return Vec::new();
    }
    let mut out = Vec::new();
    let b = lit.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'{' {
            if b.get(i + 1) == Some(&b'{') {
                i += 2;
                continue;
            }
            let start = i + 1;
            let mut j = start;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                j += 1;
            }
            let name = &lit[start..j];
            let valid = !name.is_empty() && !name.as_bytes()[0].is_ascii_digit();
            if valid && matches!(b.get(j), Some(b'}') | Some(b':')) {
                out.push(name.to_owned());
            }
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

impl<'ast> Visit<'ast> for Walker<'_> {
    fn visit_block(&mut self, b: &'ast syn::Block) {
        self.scoped(|w| {
            for stmt in &b.stmts {
                w.visit_stmt(stmt);
            }
        });
    }

    fn visit_stmt(&mut self, stmt: &'ast Stmt) {
        self.walk_stmt(stmt, false);
    }

    fn visit_item(&mut self, _: &'ast syn::Item) {
        // Items cannot capture locals; their bodies are not part of the segment.
    }

    fn visit_expr_path(&mut self, e: &'ast syn::ExprPath) {
        if e.qself.is_none() {
            if let Some(id) = e.path.get_ident() {
                self.use_name(id.to_string(), id.span());
            }
            self.check_rng_path(&e.path);
        }
    }

    fn visit_expr_closure(&mut self, e: &'ast syn::ExprClosure) {
        let alias = self.closure_alias.take();
        self.in_closure(|w| {
            for input in &e.inputs {
                w.bind(input);
                let mut bs = Vec::new();
                pat_bindings(input, &mut bs);
                if let (Some(alias), [b]) = (&alias, &bs[..]) {
                    let scope = w.scopes.last_mut().expect("a scope");
                    let alias = Alias {
                        mutable: b.mutable,
                        ..alias.clone()
                    };
                    scope.insert(b.ident.to_string(), Some(alias));
                }
            }
            w.visit_expr(&e.body);
        });
    }

    fn visit_expr_async(&mut self, e: &'ast syn::ExprAsync) {
        self.in_closure(|w| w.visit_block(&e.block));
    }

    fn visit_arm(&mut self, arm: &'ast syn::Arm) {
        self.scoped(|w| {
            w.bind(&arm.pat);
            if let Some((_, guard)) = &arm.guard {
                w.visit_expr(guard);
            }
            w.visit_expr(&arm.body);
        });
    }

    fn visit_expr_if(&mut self, e: &'ast syn::ExprIf) {
        self.scoped(|w| {
            w.visit_expr(&e.cond);
            w.visit_block(&e.then_branch);
        });
        if let Some((_, else_branch)) = &e.else_branch {
            self.visit_expr(else_branch);
        }
    }

    fn visit_expr_let(&mut self, e: &'ast syn::ExprLet) {
        self.visit_expr(&e.expr);
        self.bind(&e.pat);
    }

    fn visit_expr_while(&mut self, e: &'ast syn::ExprWhile) {
        let label = e.label.as_ref().map(|l| l.name.ident.to_string());
        self.scoped(|w| {
            w.visit_expr(&e.cond);
            w.loops.push((label, true));
            w.visit_block(&e.body);
            w.loops.pop();
        });
    }

    fn visit_expr_for_loop(&mut self, e: &'ast syn::ExprForLoop) {
        self.visit_expr(&e.expr);
        let label = e.label.as_ref().map(|l| l.name.ident.to_string());
        self.scoped(|w| {
            w.bind(&e.pat);
            w.loops.push((label, true));
            w.visit_block(&e.body);
            w.loops.pop();
        });
    }

    fn visit_expr_loop(&mut self, e: &'ast syn::ExprLoop) {
        let label = e.label.as_ref().map(|l| l.name.ident.to_string());
        self.loops.push((label, true));
        self.visit_block(&e.body);
        self.loops.pop();
    }

    fn visit_expr_block(&mut self, e: &'ast syn::ExprBlock) {
        let labeled = e.label.is_some();
        if let Some(l) = &e.label {
            self.loops.push((Some(l.name.ident.to_string()), false));
        }
        self.visit_block(&e.block);
        if labeled {
            self.loops.pop();
        }
    }

    fn visit_expr_break(&mut self, e: &'ast syn::ExprBreak) {
        let inside = match &e.label {
            Some(l) => self
                .loops
                .iter()
                .any(|(name, _)| name.as_deref() == Some(&*l.ident.to_string())),
            None => self.loops.iter().any(|(_, is_loop)| *is_loop),
        };
        if !inside {
            self.control_flow(e, "`break`");
        }
        if let Some(x) = &e.expr {
            self.visit_expr(x);
        }
    }

    fn visit_expr_continue(&mut self, e: &'ast syn::ExprContinue) {
        let inside = match &e.label {
            Some(l) => self
                .loops
                .iter()
                .any(|(name, is_loop)| *is_loop && name.as_deref() == Some(&*l.ident.to_string())),
            None => self.loops.iter().any(|(_, is_loop)| *is_loop),
        };
        if !inside {
            self.control_flow(e, "`continue`");
        }
    }

    fn visit_expr_return(&mut self, e: &'ast syn::ExprReturn) {
        // The whole function is one closure: `return` leaves it with the function's value.
        if self.closure_depth == 0 && !self.whole {
            self.control_flow(e, "`return`");
        }
        if let Some(x) = &e.expr {
            self.visit_expr(x);
        }
    }

    fn visit_expr_try(&mut self, e: &'ast syn::ExprTry) {
        if self.closure_depth == 0 {
            self.fallible.get_or_insert(e.question_token.span);
        }
        self.visit_expr(&e.expr);
    }

    fn visit_expr_unsafe(&mut self, e: &'ast syn::ExprUnsafe) {
        self.check_unsafe_block(e);
        self.visit_block(&e.block);
    }

    fn visit_expr_assign(&mut self, e: &'ast syn::ExprAssign) {
        self.check_assign(&e.left, false, e);
        syn::visit::visit_expr_assign(self, e);
        // `h = b.forward(&h)`: the local now holds what the right side aliases.
        if let Expr::Path(p) = &*e.left
            && let Some(id) = p.path.get_ident()
            && self.is_local(&id.to_string())
        {
            let alias = self
                .alias_target(&e.right)
                .map(|a| Alias { mutable: true, ..a });
            self.realias(&id.to_string(), alias);
        }
    }

    fn visit_expr_binary(&mut self, e: &'ast syn::ExprBinary) {
        use syn::BinOp::*;
        let compound = matches!(
            e.op,
            AddAssign(_)
                | SubAssign(_)
                | MulAssign(_)
                | DivAssign(_)
                | RemAssign(_)
                | BitXorAssign(_)
                | BitAndAssign(_)
                | BitOrAssign(_)
                | ShlAssign(_)
                | ShrAssign(_)
        );
        if compound {
            self.check_assign(&e.left, true, e);
            self.check_op_assign_on_handle(&e.left, &e.op, e);
        }
        syn::visit::visit_expr_binary(self, e);
    }

    fn visit_expr_method_call(&mut self, e: &'ast syn::ExprMethodCall) {
        let method = e.method.to_string();
        self.check_inplace(&method, &e.receiver, e);
        self.check_mutation(&method, e.args.len(), &e.receiver, e);
        // A closure given to a method of an outside value (`TL.with(|c| ..)`,
        // `self.bias.as_ref().map(|b| ..)`) gets that value: its parameters alias it.
        let outside = self.outside(&e.receiver).map(|a| Alias {
            kind: a.kind.then(AliasKind::Shared),
            mutable: false,
            ..a
        });
        self.visit_expr(&e.receiver);
        for arg in &e.args {
            self.closure_alias = match arg {
                Expr::Closure(_) => outside.clone(),
                _ => None,
            };
            self.visit_expr(arg);
        }
        self.closure_alias = None;
    }

    fn visit_expr_call(&mut self, e: &'ast syn::ExprCall) {
        // `Tensor::relu_(&mut xs)`, `Vec::push(&mut v, x)`: the first argument is the receiver.
        if let (Expr::Path(p), Some(first)) = (&*e.func, e.args.first())
            && p.path.segments.len() > 1
            && let Some(last) = p.path.segments.last()
        {
            let method = last.ident.to_string();
            self.check_inplace(&method, first, e);
            self.check_mutation(&method, e.args.len() - 1, first, e);
        }
        syn::visit::visit_expr_call(self, e);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        if parse::is_cut_macro(mac) {
            self.nested_cut(mac);
            return;
        }
        let name = mac
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default();
        self.check_io_macro(mac, &name);
        if EARLY_EXIT_MACROS.contains(&name.as_str()) && self.closure_depth == 0 {
            self.fallible.get_or_insert(mac.path.span());
        }
        self.check_rng_path(&mac.path);
        match mac.parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated) {
            Ok(args) => {
                for arg in &args {
                    self.visit_expr(arg);
                }
                self.scan_tokens(mac.tokens.clone(), false);
            }
            Err(_) => {
                self.scan_tokens(mac.tokens.clone(), true);
                self.scan_flags(mac, mac.tokens.clone());
            }
        }
    }
}
