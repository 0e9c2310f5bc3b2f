//! Expansion snapshots (`insta`, pretty-printed with `prettyplease`) of representative
//! functions, checks of the analysis on token streams, and the expansion-time benchmark.
//!
//! Review a changed snapshot as code: `INSTA_UPDATE=always cargo test -p ckpt-macros`
//! rewrites the files in `snapshots/`, and `git diff` shows what the macro now generates.

use proc_macro2::TokenStream;
use quote::quote;

use super::expand;

/// Expands `#[checkpointed(args)] item` and pretty-prints it; a method is shown inside
/// `impl Model { .. }`.
fn pretty(args: TokenStream, item: TokenStream, method: bool) -> String {
    let out = expand(args, item);
    let out = if method {
        quote!(impl Model { #out })
    } else {
        out
    };
    let file: syn::File = syn::parse2(out.clone())
        .unwrap_or_else(|e| panic!("expansion does not parse ({e}):\n{out}"));
    prettyplease::unparse(&file)
}

/// The messages of the `compile_error!`s in an expansion, in order.
fn errors(args: TokenStream, item: TokenStream) -> Vec<String> {
    let out = expand(args, item);
    let file: syn::File = syn::parse2(quote!(impl Model { #out })).expect("parses");
    let syn::Item::Impl(imp) = &file.items[0] else {
        unreachable!()
    };
    imp.items
        .iter()
        .filter_map(|it| match it {
            syn::ImplItem::Macro(m)
                if m.mac
                    .path
                    .segments
                    .last()
                    .is_some_and(|s| s.ident == "compile_error") =>
            {
                let lit: syn::LitStr = m.mac.parse_body().expect("a message");
                Some(lit.value())
            }
            _ => None,
        })
        .collect()
}

#[test]
fn snapshot_mlp_method() {
    insta::assert_snapshot!(pretty(
        quote!(segments = 3),
        quote! {
            fn forward(&self, xs: &Tensor) -> Tensor {
                let xs = self.l1.forward(xs).relu();
                let xs = self.l2.forward(&xs).relu();
                self.l3.forward(&xs)
            }
        },
        true
    ));
}

#[test]
fn snapshot_residual_skip_connection() {
    insta::assert_snapshot!(pretty(
        quote!(segments = 2),
        quote! {
            fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
                let h = xs.shallow_clone();
                let mut xs = self.block1.forward_t(xs, train);
                xs = xs.relu();
                let xs = xs + &h;
                let n = xs.size()[0];
                let ys = self.block2.forward_t(&xs, train);
                ys + h * (n as f64)
            }
        },
        true
    ));
}

/// `budget = ".."` (and `segments = auto`): one stage closure per statement but the last
/// over the slots of an environment, types carried by witnesses, the plan at run time.
#[test]
fn snapshot_auto_budget_stages() {
    insta::assert_snapshot!(pretty(
        quote!(budget = "40%"),
        quote! {
            fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
                let h = self.block1.forward_t(xs, train);
                let (a, b) = (h.relu(), h.tanh());
                let n = a.size()[0];
                let ys = self.block2.forward_t(&(a + b), train);
                ys + h * (n as f64)
            }
        },
        true
    ));
}

/// A layer loop under `segments = N`: the statements and the loop's iterations are stages
/// of a chain cut at run time; the loop's unit runs a range of iterations re-derived from
/// its iterable; the rotary table is a reference parameter every block reads.
#[test]
fn snapshot_layer_loop_segments() {
    insta::assert_snapshot!(pretty(
        quote!(segments = 4),
        quote! {
            fn forward(&self, x: &Tensor, freqs_cis: &Tensor) -> Tensor {
                let (_, t) = x.size2().unwrap();
                let mut x = self.wte.forward(x);
                for block in self.blocks.iter() {
                    x = block.forward(&x, freqs_cis);
                }
                let x = self.ln_f.forward(&x);
                let x = x.slice(1, t - 1, t, 1);
                self.lm_head.forward(&x)
            }
        },
        true
    ));
}

/// A `fold` over layers and a method chain, with `segments = auto`: the chain is split at
/// its layer calls, the fold's first iteration starts from its initial value, later ones
/// from the accumulator's slot; the pure last statement is profiled too.
#[test]
fn snapshot_fold_and_chain_auto() {
    insta::assert_snapshot!(pretty(
        quote!(segments = auto),
        quote! {
            fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
                let h = xs.apply(&self.embed).relu().apply_t(&self.bn, train);
                let h = self.blocks.iter().fold(h, |h, b| b.forward_t(&h, train));
                h.apply(&self.head)
            }
        },
        true
    ));
}

/// `#[checkpointed]` without arguments: one closure for the whole body, its value the
/// function's.
#[test]
fn snapshot_whole_function() {
    insta::assert_snapshot!(pretty(
        TokenStream::new(),
        quote! {
            fn forward(&self, x: &Tensor, freqs_cis: &Tensor) -> Tensor {
                let x = self.attn.forward(&self.rms_1.forward(x), freqs_cis) + x;
                self.mlp.forward(&self.rms_2.forward(&x)) + x
            }
        },
        true
    ));
}

/// The last statement is profiled with `segments = auto` only when it passes the
/// side-effect rules (and uses only values the units put in slots).
#[test]
fn auto_profiles_only_a_pure_last_statement() {
    let expand_tail = |tail: TokenStream| {
        pretty(
            quote!(segments = auto),
            quote! {
                fn f(xs: &Tensor) -> Tensor {
                    let a = xs.relu();
                    let b = a.tanh();
                    #tail
                }
            },
            false,
        )
    };
    let pure = expand_tail(quote!(b * 2.0));
    assert!(pure.contains("ProbePut"), "{pure}");
    let printing = expand_tail(quote!({
        println!("{b:?}");
        b
    }));
    assert!(!printing.contains("ProbePut"), "{printing}");
}

#[test]
fn snapshot_explicit_cuts_question_mark_generic() {
    insta::assert_snapshot!(pretty(
        quote!(preserve_rng_state = false),
        quote! {
            pub fn encode<M>(model: &M, tokens: Tensor, scale: f64) -> Result<Tensor, TchError>
            where
                M: Module + ckpt::ShallowClone + Send + 'static,
            {
                use tch::IndexOp;
                let xs = model.forward(&tokens).f_mul_scalar(scale)?;
                ckpt::cut!();
                let ys = xs.f_softmax(-1, Kind::Float)?;
                let first = ys.i(0);
                ckpt::cut!();
                Ok(first + ys.mean(Kind::Float))
            }
        },
        false
    ));
}

#[test]
fn snapshot_many_live_values_nest_tuples() {
    let lets = (0..14u32).map(|i| {
        let v = quote::format_ident!("v{i}");
        quote!(let #v = xs * #i as f64;)
    });
    let sum = (0..14).map(|i| quote::format_ident!("v{i}"));
    insta::assert_snapshot!(pretty(
        quote!(segments = 2),
        quote! {
            fn wide(xs: &Tensor) -> Tensor {
                #(#lets)*
                let _unused = 0;
                #(#sum)+*
            }
        },
        false
    ));
}

#[test]
fn snapshot_slices_strings_macros_and_self_in_macros() {
    insta::assert_snapshot!(pretty(
        quote!(segments = 4, determinism_check = false),
        quote! {
            fn mix(&self, parts: &[Tensor], label: &str, head: &impl Module) -> Tensor {
                let ys = my_macro!(self.proj, Tensor::cat(parts, 0), self::helper());
                let msg = format!("{label}: {}", self.name);
                let zs = head.forward(&ys);
                zs.set_name(&msg)
            }
        },
        true
    ));
}

#[test]
fn all_errors_are_reported_at_once() {
    let errs = errors(
        quote!(segments = 3, segments = 2, bogus = 1),
        quote! {
            fn f(&self, xs: &Tensor, out: &mut Vec<Tensor>) -> Tensor {
                println!("hi");
                self.count.set(1);
                let ys = xs.relu_();
                out.push(ys.shallow_clone());
                let zs = ys.tanh();
                zs
            }
        },
    );
    assert_eq!(
        errors_matching(&errs, "duplicate argument `segments`"),
        1,
        "{errs:#?}"
    );
    assert_eq!(
        errors_matching(&errs, "unknown argument `bogus`"),
        1,
        "{errs:#?}"
    );
    assert_eq!(errors_matching(&errs, "`println!`"), 1, "{errs:#?}");
    assert_eq!(errors_matching(&errs, "`set` on `self`"), 1, "{errs:#?}");
    assert_eq!(
        errors_matching(&errs, "in-place `relu_` on `xs`"),
        1,
        "{errs:#?}"
    );
    // `out` is a `&mut` parameter: the push changes the caller's vector (a side effect),
    // and the parameter cannot enter the segment at all.
    assert_eq!(errors_matching(&errs, "`push` on `out`"), 1, "{errs:#?}");
    assert_eq!(
        errors_matching(&errs, "`&mut` parameter `out`"),
        1,
        "{errs:#?}"
    );
    assert_eq!(errs.len(), 7, "{errs:#?}");
}

fn errors_matching(errs: &[String], needle: &str) -> usize {
    errs.iter().filter(|e| e.contains(needle)).count()
}

#[test]
fn on_error_the_original_function_is_emitted_without_markers() {
    let out = expand(
        quote!(segments = 3),
        quote! {
            fn f(xs: &Tensor) -> Tensor {
                #[ckpt::allow(io)]
                println!("ok");
                if xs.numel() == 0 {
                    return xs.shallow_clone();
                }
                xs.relu()
            }
        },
    )
    .to_string();
    assert!(out.contains("fn f"), "{out}");
    assert!(out.contains("return xs"), "{out}");
    assert!(!out.contains("ckpt :: allow"), "{out}");
    assert!(out.contains("compile_error"), "{out}");
}

/// `#[ckpt::keep]`: the kept statement splits its group and runs inline between two
/// segments; the mark is gone from the output.
#[test]
fn snapshot_kept_statement_between_segments() {
    insta::assert_snapshot!(pretty(
        quote!(segments = 2),
        quote! {
            fn forward(&self, xs: &Tensor) -> Tensor {
                let h = self.ln.forward(xs);
                #[ckpt::keep]
                let qkv = self.qkv.forward(&h);
                let a = attention(&qkv);
                let y = xs + self.out.forward(&a);
                let f = self.ff.forward(&y).relu();
                y + f
            }
        },
        true
    ));
}

/// A mark in the last group (inline anyway) does not split it: the statement before the
/// kept one stays inline, not a new checkpointed segment.
#[test]
fn a_kept_statement_in_the_inline_group_changes_nothing() {
    let item = |keep: TokenStream| {
        quote! {
            fn f(xs: &Tensor) -> Tensor {
                let a = xs.relu();
                let b = a.tanh();
                let c = b.sigmoid();
                #keep
                let d = c.exp();
                d.neg()
            }
        }
    };
    let with = expand(quote!(segments = 2), item(quote!(#[ckpt::keep]))).to_string();
    let without = expand(quote!(segments = 2), item(quote!())).to_string();
    assert_eq!(with, without);
}

/// A kept statement runs once, whatever the side-effect rules say of recomputed code, and
/// on an error the marks are gone from the emitted original function.
#[test]
fn kept_statements_skip_the_side_effect_rules_and_marks_never_reach_rustc() {
    let ok = expand(
        quote!(segments = 2),
        quote! {
            fn f(xs: &Tensor) -> Tensor {
                let a = xs.relu();
                #[ckpt::keep]
                let b = { println!("once"); a.tanh() };
                let c = b.sigmoid();
                c.exp()
            }
        },
    )
    .to_string();
    assert!(!ok.contains("compile_error"), "{ok}");
    assert!(!ok.contains("ckpt :: keep"), "{ok}");
    let err = expand(
        quote!(),
        quote! {
            fn f(xs: &Tensor) -> Tensor {
                #[ckpt::keep]
                let a = xs.relu();
                a.tanh()
            }
        },
    )
    .to_string();
    assert!(err.contains("compile_error"), "{err}");
    assert!(!err.contains("ckpt :: keep"), "{err}");
}

#[test]
fn escape_hatches_lift_exactly_their_rule() {
    let item = quote! {
        fn f(&self, xs: &Tensor) -> Tensor {
            #[ckpt::allow(io, mutation)]
            { println!("x"); self.cache.borrow_mut().clear(); }
            #[ckpt::allow(io)]
            self.hits.set(1);
            xs.relu()
        }
    };
    let errs = errors(quote!(segments = 3), item);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(errs[0].contains("`set` on `self`"), "{errs:#?}");
}

#[test]
fn shadowing_and_scopes_decide_what_crosses() {
    // `y` inside the block and the closure parameter `xs` are not the outer bindings:
    // only `xs` (the parameter) enters segment 1, only `a` leaves it.
    let out = pretty(
        quote!(segments = 2),
        quote! {
            fn f(xs: Tensor) -> Tensor {
                let a = { let y = xs.relu(); y * 2.0 };
                let f = |xs: &Tensor| xs.tanh();
                f(&a)
            }
        },
        false,
    );
    assert!(out.contains("let (xs,) = __ckpt_input;"), "{out}");
    assert!(
        !out.contains("stash(y)") && !out.contains("stash(f)"),
        "{out}"
    );
    assert!(out.contains("let (a,) ="), "{out}");
}

/// Expansion time of a 200-statement function (the benchmark issue 3 asks for). Run with
/// `cargo test -p ckpt-macros --release -- --ignored --nocapture expansion_time`.
#[test]
#[ignore = "a timing printer, not a check"]
fn expansion_time_200_statements() {
    let lets = (0..200usize).map(|i| {
        let v = quote::format_ident!("x{}", i + 1);
        let prev = quote::format_ident!("x{}", i);
        if i % 10 == 9 {
            let skip = quote::format_ident!("x{}", i - 8);
            quote!(let #v = self.blocks[#i].forward(&#prev) + &#skip;)
        } else {
            quote!(let #v = self.blocks[#i].forward(&#prev).relu();)
        }
    });
    let item = quote! {
        fn forward(&self, x0: &Tensor) -> Tensor {
            let x0 = x0.shallow_clone();
            #(#lets)*
            x200
        }
    };
    let runs = 20;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = std::time::Instant::now();
        let out = expand(quote!(segments = 8), item.clone());
        times.push(start.elapsed());
        assert!(!out.to_string().contains("compile_error"));
    }
    times.sort();
    println!(
        "expansion of a 201-statement function with segments = 8: median {:?}, min {:?}, max {:?} ({runs} runs)",
        times[runs / 2],
        times[0],
        times[runs - 1]
    );
}
