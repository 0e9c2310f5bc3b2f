//! Alias tracking: which value from outside the segment a place or a local refers to,
//! and how (the value itself, a shared reference, a tensor handle), so that a rule
//! follows a local to what it changes (`let s = &self.x; s.set(1)` changes `self.x`).
//! Also which top-level `let`s hold a reference to data or to module state, which
//! decides how (and whether) they cross a cut.

use syn::Expr;

use super::names::{ALIASING_METHODS, is_guard};
use super::walker::Walker;
use crate::checkpointed::parse::ParamKind;

/// The root of a place expression (`a` in `a.b[i]`, `*a`, `(a)`, `a.as_ref()`).
#[derive(Clone)]
pub(super) enum Root {
    /// A single identifier.
    Name(String),
    /// A longer path (`crate::COUNTER`): never local.
    Path(String),
    /// Something else (a call's result, a temporary).
    Unknown,
}

/// The root of the place `e` (see [`Root`]).
pub(super) fn root(e: &Expr) -> Root {
    match e {
        Expr::Path(p) if p.qself.is_none() => match p.path.get_ident() {
            Some(id) => Root::Name(id.to_string()),
            None => Root::Path(path_string(&p.path)),
        },
        Expr::Field(f) => root(&f.base),
        Expr::Index(i) => root(&i.expr),
        Expr::Paren(p) => root(&p.expr),
        Expr::Group(g) => root(&g.expr),
        Expr::Reference(r) => root(&r.expr),
        Expr::Unary(u) if matches!(u.op, syn::UnOp::Deref(_)) => root(&u.expr),
        // A shallow clone shares storage with what it was cloned from; the others
        // return a reference into their receiver.
        Expr::MethodCall(m)
            if (m.args.is_empty() && ALIASING_METHODS.contains(&&*m.method.to_string()))
                || is_guard(m) =>
        {
            root(&m.receiver)
        }
        _ => Root::Unknown,
    }
}

/// How a local refers to a value from outside the segment, which decides the rules that
/// follow it there.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum AliasKind {
    /// The value itself (moved in: `let mut v = outer;`) or `&mut place`: every rule.
    Full,
    /// A shared reference (`&place`, `.as_ref()`, `.borrow()`, `.deref()`, the parameter
    /// of a closure given to a method of the value): in-place ops and interior
    /// mutability reach the value; collection mutation changes only the local.
    Shared,
    /// A tensor handle (`.shallow_clone()`): only in-place ops (and `op=`) reach the
    /// storage; anything else changes the local handle.
    Handle,
}

impl AliasKind {
    /// An alias of an alias: the narrower of the two.
    pub(super) fn then(self, next: AliasKind) -> AliasKind {
        use AliasKind::*;
        match (self, next) {
            (Handle, _) | (_, Handle) => Handle,
            (Shared, _) | (_, Shared) => Shared,
            (Full, Full) => Full,
        }
    }
}

/// What a local aliases outside the segment.
#[derive(Clone)]
pub(super) struct Alias {
    pub(super) root: Root,
    pub(super) kind: AliasKind,
    /// The local is `mut`: a shared alias's `take()` / `replace(v)` / `swap` then change
    /// the local (an `Option<&T>`), not the value.
    pub(super) mutable: bool,
}

/// Which side-effect rule asks whether a place is outside the segment.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Reach {
    /// An in-place op (`relu_`): reaches storage through every kind of alias.
    Inplace,
    /// Interior mutability or a random generator: reaches through the value itself and
    /// shared references.
    Interior,
    /// Collection mutation (`push`): reaches only the value itself.
    Collection,
    /// `=` / `op=` to a place below a local (`s.x = ..`, `*r = ..`): reaches through
    /// every kind of alias.
    Assign,
}

impl Reach {
    /// Whether this rule follows `alias` to the outside value, for a call of `method`.
    pub(super) fn through(self, alias: &Alias, method: &str) -> bool {
        match (self, alias.kind) {
            (Reach::Inplace | Reach::Assign, _) | (_, AliasKind::Full) => true,
            (Reach::Interior, AliasKind::Shared) => {
                !(alias.mutable && ["take", "replace", "swap"].contains(&method))
            }
            _ => false,
        }
    }
}

impl Root {
    /// The root's name (a path joined with `::`), if it has one.
    pub(super) fn name(&self) -> Option<&str> {
        match self {
            Root::Name(n) | Root::Path(n) => Some(n),
            Root::Unknown => None,
        }
    }
}

/// `a::b::c`, without generic arguments.
pub(super) fn path_string(p: &syn::Path) -> String {
    p.segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

impl Walker<'_> {
    /// Whether `init` is a reference to module state: `&self.head`, `&self.blocks[i]`, `&m`
    /// of a module parameter.
    pub(super) fn module_ref(&self, init: &Expr) -> bool {
        match init {
            Expr::Paren(p) => self.module_ref(&p.expr),
            Expr::Reference(r) => match root(&r.expr) {
                Root::Name(n) if !self.is_local(&n) => {
                    n == "self" || matches!(self.outer.get(&n), Some(Some(k)) if k.captured())
                }
                _ => false,
            },
            _ => false,
        }
    }

    /// Whether `name` is a value of the function itself (a top-level `let` or a parameter
    /// taken by value) from before this group: a segment takes it in through its stash and
    /// gives it back, so assigning to it or mutating it as a collection inside is not a
    /// side effect (the recompute starts again from the stashed value).
    pub(super) fn movable(&self, name: &str) -> bool {
        !self.is_local(name) && matches!(self.outer.get(name), Some(None | Some(ParamKind::Owned)))
    }

    /// How a top-level `let name = init;` holds a reference to data that can cross a cut
    /// as a shallow clone: an alias of a reference parameter or reference `let`
    /// (`let residual = xs;`), or a shared reference to a value of the function
    /// (`let residual = &xs;`).
    pub(super) fn ref_kind_of(&self, init: &Expr) -> Option<ParamKind> {
        match init {
            Expr::Paren(p) => self.ref_kind_of(&p.expr),
            Expr::Path(p) if p.qself.is_none() => {
                let name = p.path.get_ident()?.to_string();
                if self.scopes[0].contains_key(&name) && self.scopes.len() == 1 {
                    return self.ref_defs.get(&name).copied();
                }
                if self.is_local(&name) {
                    return None;
                }
                match self.outer.get(&name)? {
                    Some(k) if k.by_ref() => Some(*k),
                    _ => None,
                }
            }
            Expr::Reference(r) if r.mutability.is_none() => match &*r.expr {
                Expr::Path(p) if p.qself.is_none() => {
                    let name = p.path.get_ident()?.to_string();
                    let own = (self.scopes[0].contains_key(&name)
                        && self.scopes.len() == 1
                        && !self.ref_defs.contains_key(&name))
                        || (!self.is_local(&name)
                            && matches!(
                                self.outer.get(&name),
                                Some(None | Some(ParamKind::Owned))
                            ));
                    (own && name != "self").then_some(ParamKind::RefData)
                }
                _ => None,
            },
            _ => None,
        }
    }

    /// What the local `name` aliases outside the segment, if anything.
    pub(super) fn alias_of(&self, name: &str) -> Option<Alias> {
        let scope = self.scopes.iter().rev().find(|s| s.contains_key(name))?;
        scope[name].clone()
    }

    /// Sets what the innermost local `name` aliases (after `name = ..`).
    pub(super) fn realias(&mut self, name: &str, alias: Option<Alias>) {
        if let Some(scope) = self.scopes.iter_mut().rev().find(|s| s.contains_key(name)) {
            scope.insert(name.to_string(), alias);
        }
    }

    /// The outside value a place refers to: its root when that is outside the segment
    /// (the value itself), or what a local root aliases.
    pub(super) fn outside(&self, place: &Expr) -> Option<Alias> {
        match root(place) {
            Root::Name(n) if self.is_local(&n) => self.alias_of(&n),
            Root::Unknown => None,
            root => Some(Alias {
                root,
                kind: AliasKind::Full,
                mutable: false,
            }),
        }
    }

    /// What a value makes the local it is bound to alias: a reference to an outside
    /// place, an aliasing method on one, or an outside value (or alias) moved in. A
    /// field read (`let n = self.n;`) copies; other expressions make new values.
    pub(super) fn alias_target(&self, init: &Expr) -> Option<Alias> {
        let (inner, kind) = match init {
            Expr::Paren(p) => return self.alias_target(&p.expr),
            Expr::Group(g) => return self.alias_target(&g.expr),
            Expr::Path(_) => return self.outside(init),
            Expr::Reference(r) if r.mutability.is_some() => (&*r.expr, AliasKind::Full),
            Expr::Reference(r) => (&*r.expr, AliasKind::Shared),
            Expr::MethodCall(m) if m.method == "shallow_clone" && m.args.is_empty() => {
                (&*m.receiver, AliasKind::Handle)
            }
            // A lock's or a `RefCell`'s guard: mutable access to what it locks.
            Expr::MethodCall(m) if is_guard(m) && !matches!(root(init), Root::Unknown) => {
                (init, AliasKind::Full)
            }
            Expr::MethodCall(_) if !matches!(root(init), Root::Unknown) => {
                (init, AliasKind::Shared)
            }
            _ => return None,
        };
        let mut alias = self.outside(inner)?;
        alias.kind = alias.kind.then(kind);
        Some(alias)
    }

    /// Whether a place is outside the segment for the rule `reach` (`self`, a
    /// parameter, an earlier binding, a static, or a local that aliases one of those in
    /// a way that rule follows), as the name to report; `None` when it is not, or cannot
    /// be told (a temporary). A bare local is followed only for calls on it (`method`):
    /// assigning to the local itself rebinds it. An outer binding found here is
    /// recorded as mutated.
    pub(super) fn outer_root(&mut self, e: &Expr, reach: Reach, method: &str) -> Option<String> {
        self.outer_root_of(e, reach, method).map(|(name, _)| name)
    }

    /// [`Walker::outer_root`], and whether the place is (a part of) a value of the function
    /// that the segment takes in and gives back ([`Walker::movable`]).
    pub(super) fn outer_root_of(
        &mut self,
        e: &Expr,
        reach: Reach,
        method: &str,
    ) -> Option<(String, bool)> {
        let (target, via) = match root(e) {
            Root::Name(n) if self.is_local(&n) => {
                if reach == Reach::Assign && matches!(e, Expr::Path(_)) {
                    return None;
                }
                let alias = self.alias_of(&n)?;
                if !reach.through(&alias, method) {
                    return None;
                }
                (alias.root, Some(n))
            }
            Root::Unknown => return None,
            r => (r, None),
        };
        self.record_mutated(&target);
        let movable = matches!(&target, Root::Name(n) if self.movable(n));
        let name = target.name()?;
        let name = match via {
            Some(local) => format!("{name}` through `{local}"),
            None => name.to_string(),
        };
        Some((name, movable))
    }

    /// Records an outer binding the group changes (it is then moved in and rebound).
    pub(super) fn record_mutated(&mut self, root: &Root) {
        if let Root::Name(n) = root
            && !self.mutated.contains(n)
        {
            self.mutated.push(n.clone());
        }
    }
}
