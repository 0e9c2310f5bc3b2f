//! Unit tests of the analysis on token streams: each side-effect rule (flagged, not
//! flagged where the value is the segment's own, lifted by its escape hatch), alias
//! tracking, the name tables, liveness and the stash, and the layer-loop checks. The
//! trybuild cases in `ui-tests` check the same messages as a user sees them.

use proc_macro2::TokenStream;
use quote::quote;

use super::alias::{AliasKind, Reach, Root, root};
use super::names::{is_guard, is_inplace_name, mutating_arity};
use super::walker::{Walk, Walker, format_captures};
use super::{Pass, Plan, analyze};
use crate::args::{Target, parse_args};
use crate::checkpointed::layout::Layout;
use crate::checkpointed::parse::{ParamKind, parse_function};
use crate::ctxt::Ctxt;

/// The messages of `cx`'s errors, in order.
fn messages(cx: Ctxt) -> Vec<String> {
    match cx.finish() {
        Ok(()) => Vec::new(),
        Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
    }
}

/// Walks `stmts` as the group "segment 1 of 2" of `f` (checkpointed when `check`), with
/// the function's earlier bindings `outer`; returns the walk and the errors.
fn walk_with(
    outer: &[(&str, Option<ParamKind>)],
    stmts: TokenStream,
    check: bool,
    runtime: bool,
) -> (Walk, Vec<String>) {
    let block: syn::Block = syn::parse2(quote!({ #stmts })).expect("statements");
    let mut cx = Ctxt::default();
    let mut walker = Walker::new(&mut cx, check, "segment 1 of 2".to_owned(), "f");
    walker.runtime = runtime;
    walker.outer = outer.iter().map(|(n, k)| (n.to_string(), *k)).collect();
    for stmt in &block.stmts {
        walker.walk_stmt(stmt, true);
    }
    let walk = walker.finish();
    (walk, messages(cx))
}

/// The errors of a checkpointed group of `stmts` with earlier bindings `outer`.
fn errors(outer: &[(&str, Option<ParamKind>)], stmts: TokenStream) -> Vec<String> {
    walk_with(outer, stmts, true, false).1
}

/// Asserts exactly one error, containing every one of `needles`.
fn assert_one(errs: &[String], needles: &[&str]) {
    assert_eq!(errs.len(), 1, "{errs:#?}");
    for needle in needles {
        assert!(errs[0].contains(needle), "`{needle}` not in {:?}", errs[0]);
    }
}

const DATA: Option<ParamKind> = Some(ParamKind::RefData);
const OWNED: Option<ParamKind> = Some(ParamKind::Owned);
/// A top-level `let` of the function (not a parameter).
const LOCAL: Option<ParamKind> = None;

// ---- rule `assign` ----

#[test]
fn assign_to_module_state_is_flagged_and_lifted_by_allow() {
    assert_one(
        &errors(&[], quote!(self.steps = 1;)),
        &[
            "assignment to `self`",
            "not bound inside this checkpointed segment 1 of 2",
            "#[ckpt::allow(assign)]",
        ],
    );
    assert!(errors(&[], quote!(#[ckpt::allow(assign)] self.steps = 1;)).is_empty());
    // Another rule's hatch does not lift it.
    assert_eq!(
        errors(&[], quote!(#[ckpt::allow(io)] self.steps = 1;)).len(),
        1
    );
}

#[test]
fn assign_to_a_function_value_is_carried_not_flagged() {
    let (walk, errs) = walk_with(&[("h", LOCAL)], quote!(h = h.relu();), true, false);
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(walk.mutated, vec!["h"]);
    // A value bound inside the segment is its own.
    assert!(errors(&[], quote!(let mut y = 0; y = 1;)).is_empty());
}

#[test]
fn compound_assign_to_an_earlier_binding_is_flagged() {
    assert_one(
        &errors(&[("n", LOCAL)], quote!(n += 1;)),
        &[
            "compound assignment to `n`",
            "assign a new value with `n = n + ..`",
        ],
    );
    assert_one(
        &errors(&[("xs", DATA)], quote!(xs += 1;)),
        &[
            "compound assignment to `xs`",
            "bind a new value with `let xs",
        ],
    );
}

#[test]
fn assign_through_a_local_alias_is_flagged() {
    assert_one(
        &errors(&[], quote!(let r = &mut self.stats; r.calls = 1;)),
        &["assignment to `self` through `r`"],
    );
    assert_one(
        &errors(&[], quote!(let r = &self.stats; r.calls = 1;)),
        &["assignment to `self` through `r`"],
    );
    assert_one(
        &errors(&[], quote!(*self.last.lock().unwrap() = 1;)),
        &["assignment to `self`"],
    );
    // Rebinding the local itself changes nothing outside.
    assert!(errors(&[], quote!(let mut r = &self.a; r = &self.b;)).is_empty());
}

#[test]
fn assign_to_a_reference_parameter_is_flagged() {
    assert_one(
        &errors(&[("xs", DATA)], quote!(xs = ys;)),
        &["assignment to `xs`, a reference from outside"],
    );
}

// ---- rule `inplace` ----

#[test]
fn inplace_on_an_input_is_flagged_directly_through_aliases_and_in_call_form() {
    assert_one(
        &errors(&[("xs", DATA)], quote!(let h = xs.relu_();)),
        &["in-place `relu_` on `xs`", "out-of-place `relu`"],
    );
    assert_one(
        &errors(
            &[("xs", DATA)],
            quote!(let t = xs.shallow_clone(); t.relu_();),
        ),
        &["in-place `relu_` on `xs` through `t`"],
    );
    assert_one(
        &errors(&[("xs", OWNED)], quote!(Tensor::relu_(&mut xs);)),
        &["in-place `relu_` on `xs`"],
    );
    assert!(errors(&[("xs", DATA)], quote!(#[ckpt::allow(inplace)] xs.relu_();)).is_empty());
}

#[test]
fn inplace_on_a_value_made_inside_is_fine() {
    assert!(errors(&[("xs", DATA)], quote!(let h = xs.relu(); h.relu_();)).is_empty());
    assert!(
        errors(
            &[("xs", DATA)],
            quote!(let h = xs * 2; let h = h.sigmoid_();)
        )
        .is_empty()
    );
}

#[test]
fn op_assign_on_a_shallow_clone_is_flagged_as_inplace() {
    assert_one(
        &errors(
            &[("xs", DATA)],
            quote!(let mut t = xs.shallow_clone(); t += 1;),
        ),
        &["`+=` on `t`, a shallow clone of `xs`", "let t = &t + .."],
    );
}

// ---- rule `io` ----

#[test]
fn io_macros_are_flagged_and_lifted() {
    assert_one(
        &errors(&[("x", LOCAL)], quote!(println!("{}", x);)),
        &[
            "`println!` in checkpointed segment 1 of 2",
            "ckpt::is_recomputing()",
        ],
    );
    assert_one(&errors(&[], quote!(let y = dbg!(1);)), &["`dbg!`"]);
    assert!(errors(&[("x", LOCAL)], quote!(#[ckpt::allow(io)] println!("{x}");)).is_empty());
    // `format!` builds a string: no I/O.
    assert!(errors(&[("x", LOCAL)], quote!(let s = format!("{x}");)).is_empty());
}

// ---- rule `unsafe` ----

#[test]
fn unsafe_blocks_and_unsafe_in_macros_are_flagged() {
    assert_one(
        &errors(&[], quote!(let p = unsafe { read() };)),
        &["`unsafe` block in checkpointed segment 1 of 2"],
    );
    assert_one(
        &errors(&[], quote!(my_macro!(unsafe fn f() {});)),
        &["`unsafe` in a macro"],
    );
    assert!(
        errors(
            &[],
            quote!(#[ckpt::allow(unsafe)] let p = unsafe { read() };)
        )
        .is_empty()
    );
}

// ---- rule `mutation` ----

#[test]
fn interior_mutation_of_outside_state_is_flagged() {
    assert_one(
        &errors(&[], quote!(self.calls.set(1);)),
        &["`set` on `self`", "#[ckpt::allow(mutation)]"],
    );
    assert_one(
        &errors(&[], quote!(COUNTER.fetch_add(1, Ordering::Relaxed);)),
        &["`fetch_add` on `COUNTER`"],
    );
    assert_one(
        &errors(&[], quote!(crate::STATS.store(1, Ordering::Relaxed);)),
        &["`store` on `crate::STATS`"],
    );
    // Through a shared reference: the cell is the same.
    assert_one(
        &errors(&[], quote!(let c = &self.calls; c.set(1);)),
        &["`set` on `self` through `c`"],
    );
}

#[test]
fn collection_mutation_through_guards_is_flagged() {
    assert_one(
        &errors(&[("x", LOCAL)], quote!(self.cache.lock().unwrap().push(x);)),
        &["`push` on `self`"],
    );
    assert_one(
        &errors(&[], quote!(let mut g = self.log.borrow_mut(); g.clear();)),
        &["`clear` on `self` through `g`"],
    );
}

#[test]
fn collection_mutation_of_a_function_value_is_carried() {
    let (walk, errs) = walk_with(&[("skips", LOCAL)], quote!(skips.push(h);), true, false);
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(walk.mutated, vec!["skips"]);
    // Moved into a local first: the same value, carried too.
    let (walk, errs) = walk_with(
        &[("items", LOCAL)],
        quote!(let mut v = items; v.push(h);),
        true,
        false,
    );
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(walk.mutated, vec!["items"]);
}

#[test]
fn same_named_tensor_methods_are_not_mutation() {
    // tch's `Tensor::take(&index)` and `str::replace(from, to)` are out of place.
    assert!(errors(&[("xs", DATA)], quote!(let y = xs.take(&idx);)).is_empty());
    assert!(errors(&[], quote!(let s = self.name.replace("a", "b");)).is_empty());
    assert_eq!(errors(&[], quote!(let s = self.slot.take();)).len(), 1);
}

// ---- rule `rng` ----

#[test]
fn randomness_outside_libtorch_is_flagged() {
    assert_one(
        &errors(&[], quote!(let r: f64 = rand::random();)),
        &[
            "`rand::random` is randomness outside libtorch",
            "#[ckpt::allow(rng)]",
        ],
    );
    assert_one(
        &errors(&[], quote!(let mut g = rand::thread_rng();)),
        &["`rand::thread_rng` is randomness outside libtorch"],
    );
    // Imported by `use rand::thread_rng;`: the bare name, called or passed on.
    assert_one(
        &errors(&[], quote!(let mut g = thread_rng();)),
        &["`thread_rng` is randomness outside libtorch"],
    );
    assert_one(
        &errors(&[], quote!(let g = make(thread_rng);)),
        &["`thread_rng` is randomness outside libtorch"],
    );
    assert!(errors(&[], quote!(#[ckpt::allow(rng)] let mut g = thread_rng();)).is_empty());
    assert_one(
        &errors(&[("rng", LOCAL)], quote!(let i = rng.gen_range(0..3);)),
        &["`gen_range` on `rng` draws from a random generator outside libtorch"],
    );
    assert_one(
        &errors(&[], quote!(my_macro!(fastrand => u8);)),
        &["`fastrand` is randomness outside libtorch"],
    );
    assert!(
        errors(
            &[],
            quote!(#[ckpt::allow(rng)] let r: f64 = rand::random();)
        )
        .is_empty()
    );
    // libtorch's own random ops are replayed exactly.
    assert!(errors(&[("xs", DATA)], quote!(let m = xs.rand_like();)).is_empty());
}

// ---- control flow and `?` ----

#[test]
fn control_flow_leaving_the_segment_is_flagged() {
    assert_one(
        &errors(
            &[("x", LOCAL)],
            quote!(if x {
                return y;
            }),
        ),
        &["`return` in checkpointed segment 1 of 2 would leave the segment's closure, not `f`"],
    );
    assert_one(
        &errors(&[], quote!(break;)),
        &["`break` in checkpointed segment 1 of 2"],
    );
    // Inside its own loop, or inside a closure, it stays in the segment.
    assert!(
        errors(
            &[],
            quote!(for i in 0..3 {
                if i > 1 {
                    break;
                }
                continue;
            })
        )
        .is_empty()
    );
    assert!(
        errors(
            &[],
            quote!('a: {
                break 'a;
            })
        )
        .is_empty()
    );
    assert!(errors(&[], quote!(let f = |x: i64| { return x; };)).is_empty());
    // In a group the rules do not apply to (the inline group), nothing is flagged.
    assert!(walk_with(&[], quote!(return y;), false, false).1.is_empty());
    // With cuts at run time the message names the statement's stage.
    let (_, errs) = walk_with(&[], quote!(return y;), true, true);
    assert_one(&errs, &["would leave the statement's stage closure"]);
}

#[test]
fn the_first_question_mark_outside_closures_is_recorded() {
    let (walk, _) = walk_with(&[], quote!(let f = || g()?; let a = h()?;), true, false);
    assert!(walk.fallible.is_some());
    let (walk, _) = walk_with(&[], quote!(let f = || g()?;), true, false);
    assert!(walk.fallible.is_none(), "a closure's `?` is its own");
    let (walk, _) = walk_with(&[], quote!(anyhow::ensure!(x > 0, "x");), true, false);
    assert!(walk.fallible.is_some(), "`ensure!` leaves early");
}

#[test]
fn a_nested_cut_marker_is_an_error_in_any_group() {
    let (_, errs) = walk_with(
        &[],
        quote!(if c {
            ckpt::cut!();
        }),
        false,
        false,
    );
    assert_one(&errs, &["must be a statement of the function body itself"]);
}

// ---- uses and definitions ----

#[test]
fn uses_skip_inner_bindings_and_see_format_captures() {
    let (walk, _) = walk_with(
        &[],
        quote! {
            let y = { let t = a + 1; t * b };
            let z = c.iter().map(|q| q + d).sum();
            let s = format!("{e} {y}");
            match f { Some(v) => v, None => g }
        },
        true,
        false,
    );
    let uses: Vec<&str> = walk.uses.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(uses, ["a", "b", "c", "d", "e", "f", "g"]);
    let defs: Vec<String> = walk.defs.iter().map(|b| b.ident.to_string()).collect();
    assert_eq!(defs, ["y", "z", "s"]);
}

#[test]
fn format_captures_are_found() {
    assert_eq!(
        format_captures(r#""{x} {y:?} {{z}} {0} {}""#),
        vec!["x", "y"]
    );
    assert!(format_captures("42").is_empty());
}

// ---- alias tracking and the name tables ----

#[test]
fn roots_of_places() {
    let name = |e: syn::Expr| root(&e).name().map(str::to_owned);
    assert_eq!(name(syn::parse_quote!(a.b[i].c)), Some("a".into()));
    assert_eq!(name(syn::parse_quote!(*(&mut a))), Some("a".into()));
    assert_eq!(name(syn::parse_quote!(a.lock().unwrap())), Some("a".into()));
    assert_eq!(name(syn::parse_quote!(a.shallow_clone())), Some("a".into()));
    assert_eq!(name(syn::parse_quote!(a::B)), Some("a::B".into()));
    assert!(matches!(root(&syn::parse_quote!(a.clone())), Root::Unknown));
    assert!(matches!(root(&syn::parse_quote!(f(a))), Root::Unknown));
}

#[test]
fn alias_kinds_narrow_and_decide_what_reaches() {
    use AliasKind::*;
    assert!(Full.then(Shared) == Shared && Shared.then(Handle) == Handle);
    assert!(Full.then(Full) == Full);
    let alias = |kind, mutable| super::alias::Alias {
        root: Root::Name("x".into()),
        kind,
        mutable,
    };
    assert!(Reach::Inplace.through(&alias(Handle, false), "relu_"));
    assert!(!Reach::Interior.through(&alias(Handle, false), "set"));
    assert!(Reach::Interior.through(&alias(Shared, false), "set"));
    // A `mut` local holding a shared reference: `take()` changes the local.
    assert!(!Reach::Interior.through(&alias(Shared, true), "take"));
    assert!(!Reach::Collection.through(&alias(Shared, false), "push"));
    assert!(Reach::Collection.through(&alias(Full, false), "push"));
}

#[test]
fn name_tables() {
    assert!(is_inplace_name("relu_") && is_inplace_name("f_add_"));
    assert!(!is_inplace_name("_") && !is_inplace_name("_x_") && !is_inplace_name("relu"));
    assert!(mutating_arity("take", 0) && !mutating_arity("take", 1));
    assert!(mutating_arity("set", 1) && !mutating_arity("set", 0));
    assert!(mutating_arity("replace", 1) && !mutating_arity("replace", 2));
    assert!(mutating_arity("push", 1));
    let guard = |e: syn::Expr| match e {
        syn::Expr::MethodCall(m) => is_guard(&m),
        _ => unreachable!(),
    };
    assert!(guard(syn::parse_quote!(a.lock())));
    assert!(guard(syn::parse_quote!(a.lock().unwrap())));
    assert!(guard(syn::parse_quote!(a.borrow_mut().expect("x"))));
    assert!(!guard(syn::parse_quote!(a.borrow())));
    assert!(!guard(syn::parse_quote!(a.get(0).unwrap())));
}

// ---- whole functions: liveness, the stash, layer loops ----

/// Analyzes `#[checkpointed(args)] item`: the plan, or the error messages.
fn plan(args: TokenStream, item: TokenStream) -> Result<Plan, Vec<String>> {
    let mut cx = Ctxt::default();
    let args = parse_args(args, Target::Function, &mut cx);
    let func = parse_function(item).expect("a function");
    let plan = analyze(&func, &args, &mut cx);
    let errs = messages(cx);
    match plan {
        Some(plan) if errs.is_empty() => Ok(plan),
        _ => Err(errs),
    }
}

fn names(bs: impl IntoIterator<Item = String>) -> Vec<String> {
    bs.into_iter().collect()
}

#[test]
fn liveness_decides_inputs_outputs_and_how_they_pass() {
    let plan = plan(
        quote!(segments = 3),
        quote! {
            fn f(&self, xs: &Tensor, scale: f64) -> Tensor {
                let h = self.a.forward(xs);
                let skip = h.shallow_clone();
                let h = self.b.forward(&h) * scale;
                let y = h + skip;
                let unused = 1;
                y
            }
        },
    )
    .expect("no errors");
    assert!(matches!(plan.layout, Layout::Static));
    let ranges: Vec<_> = plan.groups.iter().map(|g| g.stmts.clone()).collect();
    assert_eq!(ranges, [0..2, 2..4, 4..6]);
    let g0 = &plan.groups[0];
    let inputs: Vec<_> = g0
        .inputs
        .iter()
        .map(|i| (i.binding.ident.to_string(), i.pass))
        .collect();
    assert_eq!(inputs, [("xs".to_owned(), Pass::ByRef(ParamKind::RefData))]);
    assert!(g0.uses_self);
    assert_eq!(
        names(g0.outputs.iter().map(|b| b.ident.to_string())),
        ["h", "skip"]
    );
    let g1 = &plan.groups[1];
    let inputs: Vec<_> = g1
        .inputs
        .iter()
        .map(|i| (i.binding.ident.to_string(), i.pass))
        .collect();
    // `h` is redefined, `skip` and `scale` are not used after the group: all moved.
    assert_eq!(
        inputs,
        [
            ("h".to_owned(), Pass::Move),
            ("scale".to_owned(), Pass::Move),
            ("skip".to_owned(), Pass::Move),
        ]
    );
    assert_eq!(names(g1.outputs.iter().map(|b| b.ident.to_string())), ["y"]);
    // The last group runs inline: no stash.
    assert!(plan.groups[2].inputs.is_empty() && plan.groups[2].outputs.is_empty());
}

#[test]
fn a_value_used_after_the_group_is_duplicated_and_a_mut_one_carried() {
    let plan = plan(
        quote!(segments = 2),
        quote! {
            fn f(xs: Tensor, mut acc: Vec<Tensor>) -> Tensor {
                let h = xs.relu();
                acc.push(h.exp());
                let y = &h + &xs;
                y + acc.len() as f64
            }
        },
    )
    .expect("no errors");
    let g0 = &plan.groups[0];
    let pass = |name: &str| {
        g0.inputs
            .iter()
            .find(|i| i.binding.ident == name)
            .map(|i| i.pass)
    };
    // `xs` is used after the group: a shallow clone enters.
    assert_eq!(pass("xs"), Some(Pass::Dup));
    // `acc` is changed inside: it is moved in and given back.
    assert_eq!(pass("acc"), Some(Pass::Move));
    assert_eq!(
        names(g0.carried.iter().map(|b| b.ident.to_string())),
        ["acc"]
    );
    assert_eq!(
        names(g0.outputs.iter().map(|b| b.ident.to_string())),
        ["acc", "h"]
    );
}

#[test]
fn a_mut_reference_parameter_cannot_enter_a_segment() {
    let errs = plan(
        quote!(segments = 2),
        quote! {
            fn f(xs: &Tensor, out: &mut Vec<Tensor>) -> Tensor {
                let n = out.len();
                xs.exp() * n as f64
            }
        },
    )
    .err()
    .expect("an error");
    assert_one(
        &errs,
        &["`&mut` parameter `out` cannot enter checkpointed segment 1 of 2"],
    );
    let errs = plan(
        quote!(),
        quote!(
            fn f(out: &mut Vec<Tensor>) -> usize {
                out.len()
            }
        ),
    )
    .err()
    .expect("an error");
    assert_one(&errs, &["cannot enter the checkpointed function"]);
}

#[test]
fn references_to_module_state_cannot_cross_a_cut() {
    let errs = plan(
        quote!(segments = 2),
        quote! {
            fn f(&self, xs: &Tensor) -> Tensor {
                let lin = &self.head;
                lin.forward(xs)
            }
        },
    )
    .err()
    .expect("an error");
    assert_one(
        &errs,
        &["`lin` refers to module state (`&self.head`) and leaves checkpointed segment 1 of 2"],
    );
}

#[test]
fn a_deferred_let_cannot_be_cut_from_its_assignment() {
    let errs = plan(
        quote!(),
        quote! {
            fn f(xs: &Tensor) -> Tensor {
                let y;
                ckpt::cut!();
                y = xs.relu();
                ckpt::cut!();
                y
            }
        },
    )
    .err()
    .expect("an error");
    assert_one(
        &errs,
        &[
            "`let y;` declares `y` without a value, and a cut separates it from its assignment in checkpointed segment 2 of 3",
        ],
    );
}

#[test]
fn question_marks_in_run_time_chains_and_option_functions() {
    let errs = plan(
        quote!(segments = auto),
        quote! {
            fn f(xs: &Tensor) -> Result<Tensor, E> {
                let h = xs.f_relu()?;
                Ok(h)
            }
        },
    )
    .err()
    .expect("an error");
    assert_one(&errs, &["`?` in statement 1 of 2 of `f`"]);
    let errs = plan(
        quote!(),
        quote!(
            fn f(xs: &Tensor) -> Option<Tensor> {
                let h = g(xs)?;
                Some(h)
            }
        ),
    )
    .err()
    .expect("an error");
    assert_one(
        &errs,
        &["`?` on an `Option` in checkpointed segment (the whole function) of `f`"],
    );
    // On `Result` with markers, `?` is supported.
    plan(
        quote!(),
        quote!(
            fn f(xs: &Tensor) -> Result<Tensor, E> {
                let h = g(xs)?;
                ckpt::cut!();
                Ok(h)
            }
        ),
    )
    .expect("`?` in a fixed segment");
}

#[test]
fn layer_loop_iterables_and_breaks_are_checked() {
    let errs = plan(
        quote!(segments = 2),
        quote! {
            fn f(&self, xs: &Tensor) -> Tensor {
                let n = self.blocks.len();
                let mut h = xs.shallow_clone();
                for i in 0..n {
                    h = self.blocks[i].forward(&h);
                    if h.is_empty() { break; }
                }
                h
            }
        },
    )
    .err()
    .expect("errors");
    assert_eq!(errs.len(), 2, "{errs:#?}");
    assert!(errs[0].contains("uses `n`, a local binding"), "{}", errs[0]);
    assert!(errs[1].contains("`break` in the layer loop"), "{}", errs[1]);
    let errs = plan(
        quote!(segments = 2),
        quote! {
            fn f(xs: &Tensor, mut n: usize) -> Tensor {
                let mut h = xs.shallow_clone();
                for _ in 0..n { h = h.relu(); }
                h
            }
        },
    )
    .err()
    .expect("an error");
    assert_one(&errs, &["uses `n`, a `mut` parameter"]);
    let errs = plan(
        quote!(segments = 2),
        quote! {
            fn f(xs: &Tensor, blocks: Vec<Linear>) -> Tensor {
                let mut h = xs.shallow_clone();
                for b in blocks { h = b.forward(&h); }
                h
            }
        },
    )
    .err()
    .expect("an error");
    assert_one(&errs, &["iterates over `blocks` itself"]);
}

#[test]
fn a_folds_initial_value_enters_only_its_first_iteration() {
    let plan = plan(
        quote!(segments = auto),
        quote! {
            fn f(&self, xs: &Tensor) -> Tensor {
                let x0 = xs.relu();
                let h = self.blocks.iter().fold(x0, |h, b| b.forward(&h));
                h.exp()
            }
        },
    )
    .expect("no errors");
    assert!(matches!(plan.layout, Layout::Runtime(_)));
    // `x0` is binding 1 (after the parameter `xs`).
    assert_eq!(plan.init_only[1], [1]);
    assert_eq!(
        plan.fold_accs[1].as_ref().map(|b| b.ident.to_string()),
        Some("h".to_owned())
    );
}

#[test]
fn segments_n_cuts_as_checkpoint_sequential_and_model_do() {
    // 8 statements in 3 segments: 2, 2 and the rest (4), PyTorch's grouping, which
    // `ckpt_budget::sequential_ranges` is the one place of: `model!`'s `segments = N` and
    // `checkpoint_sequential` apply it at run time, a function at compile time.
    let plan = plan(
        quote!(segments = 3),
        quote! {
            fn f(x: &Tensor) -> Tensor {
                let a = x.relu();
                let b = a.relu();
                let c = b.relu();
                let d = c.relu();
                let e = d.relu();
                let g = e.relu();
                let h = g.relu();
                h.relu()
            }
        },
    )
    .expect("no errors");
    let ranges: Vec<_> = plan.groups.iter().map(|g| g.stmts.clone()).collect();
    assert_eq!(ranges, [0..2, 2..4, 4..8]);
    assert_eq!(ranges, ckpt_budget::sequential_ranges(8, 3));
}
