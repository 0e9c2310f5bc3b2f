//! The name tables of the side-effect rules: which macros do I/O or leave early, which
//! methods mutate, alias, lock or draw random numbers, and which crates are randomness
//! outside libtorch. The macro has no type information, so these names are the whole of
//! what it knows about a call; a rule asks here, and a new method or crate is one line.

use syn::Expr;

/// Macros that do I/O (rule `io`): they would print again when backward replays the
/// segment.
pub(super) const IO_MACROS: &[&str] = &[
    "println", "print", "eprintln", "eprint", "dbg", "write", "writeln",
];
/// Macros that return early with an error, as `?` does (`anyhow`'s).
pub(super) const EARLY_EXIT_MACROS: &[&str] = &["bail", "ensure"];
/// Interior mutability: changes a value through a shared reference (with `fetch_*`).
/// Taking a lock or a `RefCell` borrow is not in the list: reading through it is fine
/// (a `ckpt::Shared` module's `lock()`), and a change through it is seen on what it
/// locks ([`GUARD_METHODS`]).
pub(super) const INTERIOR_METHODS: &[&str] = &[
    "set",
    "store",
    "compare_exchange",
    "compare_exchange_weak",
    "replace",
    "take",
    "swap",
];
/// Collection and `Option` mutation: changes a value through `&mut` (the receiver itself,
/// or what an `&mut` alias points to).
pub(super) const COLLECTION_METHODS: &[&str] = &[
    "replace",
    "take",
    "swap",
    "get_mut",
    "push",
    "push_back",
    "push_front",
    "pop",
    "pop_back",
    "pop_front",
    "insert",
    "remove",
    "clear",
    "extend",
    "append",
    "truncate",
    "retain",
    "drain",
    "entry",
];

/// Whether a call of `method` with `args` arguments (the receiver not counted) can
/// mutate: tch's out-of-place `Tensor::take(&index)` and `Tensor::set()`, and
/// `str::replace(from, to)`, share their names with `Option::take()`, `Cell::set(v)` and
/// `Option::replace(v)`.
pub(super) fn mutating_arity(method: &str, args: usize) -> bool {
    match method {
        "take" => args == 0,
        "set" => args >= 1,
        "replace" => args == 1,
        _ => true,
    }
}

/// Crates of randomness outside libtorch (rule `rng`): a path through them, or the
/// crate's name inside a macro, draws numbers a recompute would not draw again.
pub(super) const RNG_CRATES: &[&str] = &["rand", "fastrand", "getrandom"];
/// Functions of those crates that are randomness under their bare name too, imported by
/// `use` (`use rand::thread_rng; thread_rng()`), in a path or a macro (rule `rng`).
pub(super) const RNG_FUNCTIONS: &[&str] = &["thread_rng"];
/// Methods of a random generator outside libtorch (`rand`'s `Rng`, `RngCore`,
/// `SliceRandom`) called on a generator from outside the segment (rule `rng`).
pub(super) const RNG_METHODS: &[&str] = &[
    "gen",
    "gen_range",
    "gen_bool",
    "random",
    "random_range",
    "random_bool",
    "sample",
    "shuffle",
    "fill_bytes",
    "next_u32",
    "next_u64",
];

/// Methods whose result refers to their receiver (`clone` is not one: on a `Vec` it is
/// a copy; an `Arc` cloned out of `self` is not followed).
pub(super) const ALIASING_METHODS: &[&str] =
    &["shallow_clone", "as_ref", "as_deref", "borrow", "deref"];

/// Methods (without arguments) that give mutable access to what their receiver holds: a
/// change through their result (`self.cache.lock().push(x)`, `*last.lock().unwrap() =
/// ..`, `let g = log.borrow_mut(); g.clear()`) is a change of the receiver.
pub(super) const GUARD_METHODS: &[&str] = &["lock", "try_lock", "borrow_mut", "write", "get_mut"];

/// Whether `m` is a guard method call, or `unwrap` / `expect` of one.
pub(super) fn is_guard(m: &syn::ExprMethodCall) -> bool {
    let name = m.method.to_string();
    match &*name {
        "unwrap" | "expect" => matches!(&*m.receiver, Expr::MethodCall(r) if is_guard(r)),
        _ => m.args.is_empty() && GUARD_METHODS.contains(&&*name),
    }
}

/// Whether `name` is tch's name of an in-place op (`relu_`, `f_add_`): it ends with
/// `_` and does not start with one.
pub(super) fn is_inplace_name(name: &str) -> bool {
    name.len() > 1 && name.ends_with('_') && !name.starts_with('_')
}
