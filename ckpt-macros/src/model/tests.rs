//! Unit tests of `model!` on token streams: the parser's view of declarations, the error
//! messages (all of them per compile), and expansion snapshots (`insta`, pretty-printed
//! with `prettyplease`; review a changed snapshot as code after
//! `INSTA_UPDATE=always cargo test -p ckpt-macros`).

use proc_macro2::TokenStream;
use quote::quote;

use super::ast::{Builtin, FieldKind, Item};
use super::expand;
use crate::args::Schedule;
use crate::ctxt::Ctxt;

/// Expands and pretty-prints.
fn pretty(input: TokenStream) -> String {
    let out = expand(input);
    let file: syn::File = syn::parse2(out.clone())
        .unwrap_or_else(|e| panic!("expansion does not parse ({e}):\n{out}"));
    prettyplease::unparse(&file)
}

/// The messages of the `compile_error!`s of an expansion, in order.
fn errors(input: TokenStream) -> Vec<String> {
    let out = expand(input);
    let file: syn::File = syn::parse2(out).expect("the expansion parses");
    file.items
        .iter()
        .filter_map(|it| match it {
            syn::Item::Macro(m)
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

/// Whether the expansion defines an item (`impl .. Trait for ..`) whose text contains
/// `needle`.
fn has_impl_of(input: TokenStream, trait_name: &str) -> bool {
    let file: syn::File = syn::parse2(expand(input)).expect("parses");
    file.items.iter().any(|it| match it {
        syn::Item::Impl(i) => i.trait_.as_ref().is_some_and(|(_, path, _)| {
            path.segments.last().is_some_and(|s| s.ident == trait_name)
        }),
        _ => false,
    })
}

/// Asserts that there are as many messages as `expected` and that each contains its own.
fn assert_contains_each(errs: &[String], expected: &[&str]) {
    assert_eq!(errs.len(), expected.len(), "{errs:#?}");
    for (e, want) in errs.iter().zip(expected) {
        assert!(e.contains(want), "`{e}` does not contain `{want}`");
    }
}

fn parse(input: TokenStream) -> (super::ast::Model, Vec<String>) {
    let mut cx = Ctxt::default();
    let model = super::parse::parse_model(input, &mut cx).expect("header parses");
    super::valid::check(&model, &mut cx);
    let errors = match cx.finish() {
        Ok(()) => Vec::new(),
        Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
    };
    (model, errors)
}

#[test]
fn parses_every_item_form() {
    let (model, errors) = parse(quote! {
        /// Docs.
        #[checkpointed(segments = 3, preserve_rng_state = false)]
        pub struct M<T: Module, const N: usize>(p, cfg: &Config, scale: f64) where T: Clone {
            let pad: Tensor = xs.eq(0),
            let n: i64 = if train { 1 } else { 2 },
            #[field] pos: Tensor = p.var("pos", &[4], Init::Const(0.)),
            /// The input layer.
            pub fc1: nn::Linear = nn::linear(p, 4, 8, Default::default()),
            relu,
            dropout(cfg.p),
            #[train] bn: nn::BatchNorm = nn::batch_norm1d(p, 8, Default::default()),
            blocks: [Block; cfg.layers] = Block::new(p, cfg) => |b, xs| b.forward(xs, &pad),
            more: [Block; N] = |i| Block::new(p, i),
            my_fn,
            #[train] Self::noisy,
            |xs| xs * scale,
            |xs, train| xs.dropout(0.5, train),
            inner: T = inner,
        }
    });
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(model.ident, "M");
    assert_eq!(model.path.ident, "p");
    assert_eq!(model.params.len(), 2);
    assert!(model.generics.where_clause.is_some());
    let ck = model.checkpoint.as_ref().expect("checkpointed");
    assert_eq!(ck.schedule, Schedule::Segments(3));
    assert_eq!(ck.preserve_rng_state, Some(false));
    assert_eq!(ck.determinism_check, None);
    let kinds: Vec<&str> = model
        .items
        .iter()
        .map(|i| match i {
            Item::Let(_) => "let",
            Item::Field(f) => match f.kind {
                FieldKind::Layer => "layer",
                FieldKind::Repeated { .. } => "repeated",
                FieldKind::Plain => "field",
            },
            Item::Builtin(b) if b.kind == Builtin::Dropout => "dropout",
            Item::Builtin(_) => "builtin",
            Item::Function(_) => "function",
            Item::Closure(_) => "closure",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "let", "let", "field", "layer", "builtin", "dropout", "layer", "repeated", "repeated",
            "function", "function", "closure", "closure", "layer"
        ]
    );
    let train: Vec<bool> = model.items.iter().map(Item::needs_train).collect();
    assert_eq!(
        train,
        [
            false, true, false, false, false, true, true, false, false, false, true, false, true,
            false
        ]
    );
}

#[test]
fn module_or_module_t_never_both() {
    let plain = quote! {
        struct A(p) { fc: nn::Linear = nn::linear(p, 2, 2, Default::default()), relu }
    };
    assert!(has_impl_of(plain.clone(), "Module"));
    assert!(!has_impl_of(plain, "ModuleT"));
    for train_stage in [
        quote!(dropout(0.1)),
        quote!(|xs, train| xs.dropout(0.1, train)),
        quote!(
            #[train]
            f
        ),
        quote!(#[train] bn: nn::BatchNorm = nn::batch_norm1d(p, 2, Default::default())),
        quote!(b: [B; 2] = B::new(p) => |b, xs, train| b.f(xs, train)),
    ] {
        let input = quote! {
            struct A(p) { fc: nn::Linear = nn::linear(p, 2, 2, Default::default()), #train_stage }
        };
        assert!(has_impl_of(input.clone(), "ModuleT"), "{train_stage}");
        assert!(!has_impl_of(input, "Module"), "{train_stage}");
    }
    let via_let = quote! {
        struct A(p) { let k: f64 = if train { 1.0 } else { 0.0 }, |xs| xs * k }
    };
    assert!(has_impl_of(via_let, "ModuleT"));
}

#[test]
fn reports_every_error_in_one_expansion() {
    let errs = errors(quote! {
        #[checkpointed(segments = 0, segmnets = 2, preserve_rng_state = true, preserve_rng_state = false)]
        pub struct Bad(p, cfg: &Config) {
            fc1: nn::Linear = nn::linear(p, 2, 2, Default::default()),
            fc1: nn::Linear = nn::linear(p, 2, 2, Default::default()),
            fc2: nn::Linear,
            blocks: [Block; 3],
            xs.relu(),
            relu(1),
            dropout,
            |a, b, c| a,
            #[trian] fc3: nn::Linear = nn::linear(p, 2, 2, Default::default()),
            let late: Tensor = xs.ones_like(),
            let untyped = 3,
            5,
        }
    });
    let expected = [
        "`segments = 0`",
        "unknown argument `segmnets`",
        "duplicate argument `preserve_rng_state`",
        "stage `fc2` has no constructor",
        "stage `blocks` has no constructor",
        "unknown stage syntax",
        "the built-in `relu` takes no arguments",
        "`dropout` takes the probability",
        "this closure takes 3 parameters",
        "unknown attribute `#[trian]`",
        "per-call value `untyped` needs a type",
        "unknown stage syntax",
        "duplicate field `fc1`",
        "per-call value `late` follows a stage",
    ];
    assert_contains_each(&errs, &expected);
}

#[test]
fn checkpoint_argument_errors() {
    let one = |attr: TokenStream| {
        errors(quote! {
            #attr
            struct A(p) { relu }
        })
    };
    let e = one(quote!(#[checkpointed]));
    assert_eq!(e.len(), 1);
    assert!(e[0].contains("needs `segments = N`"), "{e:?}");
    let e = one(quote!(#[checkpointed(preserve_rng_state = false)]));
    assert!(e[0].contains("needs `segments = N`"), "{e:?}");
    // The planner's schedules.
    assert!(one(quote!(#[checkpointed(segments = auto)])).is_empty());
    assert!(one(quote!(#[checkpointed(budget = "512 MiB")])).is_empty());
    assert!(one(quote!(#[checkpointed(segments = auto, budget = "40%")])).is_empty());
    let e = one(quote!(#[checkpointed(budget = "12 parsecs")]));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].contains("unknown unit \"parsecs\""), "{e:?}");
    let e = one(quote!(#[checkpointed(budget = 512)]));
    assert!(e[0].contains("`budget` takes a string"), "{e:?}");
    let e = one(quote!(#[checkpointed(segments = 3, budget = "1 GiB")]));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].contains("cannot be combined with `segments = N`"),
        "{e:?}"
    );
    let e = one(quote!(#[checkpointed(budget = "1 GiB", budget = "2 GiB")]));
    assert_eq!(e, ["duplicate argument `budget`"]);
    let e = one(quote!(#[checkpointed(segments = 2, segments = 3)]));
    assert_eq!(e, ["duplicate argument `segments`"]);
    let e = one(quote!(#[checkpointed(segments = "2")]));
    assert!(
        e[0].contains("`segments` takes a positive integer"),
        "{e:?}"
    );
    let e = one(quote!(#[checkpointed(determinism_check = 1)]));
    assert!(
        e[0].contains("`determinism_check` takes `true` or `false`"),
        "{e:?}"
    );
    assert!(one(quote!(#[checkpointed(segments = 2, policy = selective)])).is_empty());
    assert!(one(quote!(#[checkpointed(segments = 2, policy = full)])).is_empty());
    assert!(one(quote!(#[checkpointed(segments = 2, policy = masks)])).is_empty());
    assert!(one(quote!(#[checkpointed(segments = 2, policy = narrowing)])).is_empty());
    let e = one(quote!(#[checkpointed(segments = 2, policy = fast)]));
    assert_eq!(
        e,
        [
            "`policy` takes `full` (recompute everything, the default), `masks` (keep dropout masks), `narrowing` (keep dropout masks and narrowing linear outputs) or `selective` (keep linear outputs and dropout masks): `policy = masks`"
        ]
    );
    let e = one(quote!(#[checkpointed(segments = 2, policy = full, policy = selective)]));
    assert_eq!(e, ["duplicate argument `policy`"]);
    let e = one(quote!(#[checkpointed(segments = 2)] #[ckpt::checkpointed(segments = 3)]));
    assert_eq!(e, ["duplicate `#[checkpointed]` attribute"]);
    // `segments = 1` is valid: one plain segment, as `checkpoint_sequential`.
    assert!(one(quote!(#[checkpointed(segments = 1)])).is_empty());
}

#[test]
fn keep_marks_stages_and_its_misuse_is_reported() {
    let (model, errs) = parse(quote! {
        #[checkpointed(segments = 2)]
        struct A(p) {
            fc: nn::Linear = nn::linear(p, 2, 2, Default::default()),
            #[keep] blocks: [B; 3] = B::new(p),
            #[ckpt::keep] relu,
            #[keep] my_fn,
            #[keep] |xs| xs * 2.0,
            out: nn::Linear = nn::linear(p, 2, 2, Default::default()),
        }
    });
    assert!(errs.is_empty(), "{errs:?}");
    let kept: Vec<usize> = model.kept().map(|(k, _, _)| k).collect();
    assert_eq!(kept, [1, 2, 3, 4]);

    let errs = errors(quote! {
        #[checkpointed(segments = 2)]
        struct A(p) {
            #[keep] let m: Tensor = xs.ne(0),
            #[keep] #[field] k: i64 = 3,
            #[keep] #[keep] relu,
            #[keep(all)] gelu,
            #[ckpt::train] tanh,
            silu,
        }
    });
    let expected = [
        "`#[keep]` marks a stage whose output is stored instead of recomputed; a per-call value",
        "`#[keep]` marks a stage whose output is stored instead of recomputed; a `#[field]` is not a stage",
        "duplicate `#[keep]`",
        "`#[keep]` takes no arguments",
        "unknown attribute `#[ckpt::train]`",
    ];
    assert_contains_each(&errs, &expected);

    let one = |attr: TokenStream| {
        errors(quote! {
            #attr
            struct A(p) { #[keep] relu, gelu }
        })
    };
    let e = one(quote!());
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].contains("but `A` is not checkpointed"), "{e:?}");
    // The planner keeps `#[keep]` stages (forced kept).
    for attr in [
        quote!(#[checkpointed(segments = auto)]),
        quote!(#[checkpointed(budget = "40%")]),
    ] {
        assert!(one(attr).is_empty());
    }
    // An invalid `#[checkpointed]` is reported alone.
    assert_eq!(one(quote!(#[checkpointed(segments = 0)])).len(), 1);
    assert!(one(quote!(#[checkpointed(segments = 2)])).is_empty());
    assert!(one(quote!(#[checkpointed(segments = 1)])).is_empty());
    let e = errors(quote! {
        #[checkpointed(segments = 2)]
        struct A(p) { #[field] k: i64 = 3, #[keep] relu, #[keep] gelu }
    });
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].contains("every stage of `A` is marked `#[keep]`"),
        "{e:?}"
    );
}

#[test]
fn header_errors() {
    assert!(errors(quote!(struct A { relu }))[0].contains("constructor's parameters"));
    assert!(errors(quote!(struct A() { relu }))[0].contains("`nn::Path`"));
    assert!(errors(quote!(enum A(p) { relu }))[0].contains("expected `struct`"));
    assert!(errors(quote!(struct A(p, cfg) { relu }))[0].contains("needs a type"));
    assert!(errors(quote!(struct A(p) {}))[0].contains("has no stage"));
    assert!(errors(quote!(struct A(p) { #[field] k: i64 = 3 }))[0].contains("has no stage"));
}

#[test]
fn error_output_keeps_the_struct_and_stub_impls() {
    let out = pretty(quote! {
        pub struct A<T>(p, inner: T) {
            fc: nn::Linear = nn::linear(p, 2, 2, Default::default()),
            bad stage,
        }
    });
    assert!(out.contains("pub struct A<T>"), "{out}");
    assert!(out.contains("fc: nn::Linear"), "{out}");
    assert!(out.contains("PhantomData"), "{out}");
    assert!(out.contains("pub fn new"), "{out}");
    assert!(out.contains("Module for A<T>"), "{out}");
    assert!(out.contains("ShallowClone for A<T>"), "{out}");
    assert!(out.contains("compile_error!"), "{out}");
}

#[test]
fn snapshot_plain_mlp() {
    insta::assert_snapshot!(pretty(quote! {
        /// A perceptron.
        pub struct Mlp(p, cfg: &MlpConfig) {
            fc1: nn::Linear = nn::linear(p, cfg.d_in, cfg.hidden, Default::default()),
            relu,
            fc2: nn::Linear = nn::linear(p, cfg.hidden, cfg.classes, Default::default()),
        }
    }));
}

#[test]
fn snapshot_checkpointed_encoder() {
    insta::assert_snapshot!(pretty(quote! {
        /// An encoder.
        #[checkpointed(segments = 3, determinism_check = false)]
        pub struct Encoder(p, c: &Config) {
            let pad: Tensor = xs.eq(0),
            #[field] pos: Tensor = p.randn("pos", &[c.seq_len, c.d_model], 0.0, 0.02),
            tok: nn::Embedding = nn::embedding(p, c.vocab, c.d_model, Default::default())
                => |tok, ids| ids.apply(tok) + self.pos.narrow(0, 0, ids.size()[1]),
            dropout(c.dropout),
            blocks: [Block; c.layers] = Block::new(p, c) => |b, xs, train| b.forward(xs, &pad, train),
            ln: nn::LayerNorm = nn::layer_norm(p, vec![c.d_model], Default::default()),
            |xs| xs.mean_dim(1, false, Kind::Float),
            head: nn::Linear = nn::linear(p, c.d_model, c.classes, Default::default()),
        }
    }));
}

#[test]
fn snapshot_kept_stages() {
    insta::assert_snapshot!(pretty(quote! {
        #[checkpointed(segments = 2)]
        struct Kept(p) {
            fc: nn::Linear = nn::linear(p, 4, 8, Default::default()),
            #[keep] blocks: [Block; 2] = Block::new(p),
            #[keep] relu,
            out: nn::Linear = nn::linear(p, 8, 2, Default::default()),
        }
    }));
}

#[test]
fn snapshot_generics() {
    insta::assert_snapshot!(pretty(quote! {
        #[checkpointed(segments = 2)]
        pub(crate) struct Stack<M, const N: usize>(p: &nn::Path, width: i64, make: fn(nn::Path, i64) -> M)
        where
            M: Module,
        {
            blocks: [M; N] = make(p, width),
            #[train] Self::noise,
        }
    }));
}

/// The inherent methods of `tokens` with the model's visibility, as `name/arity`.
fn public_methods(tokens: TokenStream) -> Vec<String> {
    let file: syn::File = syn::parse2(tokens).expect("parses");
    let mut out: Vec<String> = file
        .items
        .iter()
        .filter_map(|it| match it {
            syn::Item::Impl(i) if i.trait_.is_none() => Some(&i.items),
            _ => None,
        })
        .flatten()
        .filter_map(|it| match it {
            syn::ImplItem::Fn(f) if matches!(f.vis, syn::Visibility::Public(_)) => {
                Some(format!("{}/{}", f.sig.ident, f.sig.inputs.len()))
            }
            _ => None,
        })
        .collect();
    out.sort();
    out
}

#[test]
fn stubs_declare_the_methods_the_expansion_has() {
    for train in [quote!(), quote!(#[train])] {
        let (model, errs) = parse(quote! {
            #[checkpointed(segments = 2)]
            pub struct M(p) {
                a: nn::Linear = nn::linear(p, 4, 4, Default::default()),
                #train b: Block = Block::new(p),
            }
        });
        assert!(errs.is_empty(), "{errs:?}");
        let full = public_methods(super::expand::expand(&model));
        let stubs = public_methods(super::expand::stubs(&model));
        assert!(full.contains(&"set_schedule/2".to_owned()), "{full:?}");
        assert!(full.contains(&"new/1".to_owned()), "{full:?}");
        assert_eq!(full.len(), 12, "{full:?}");
        assert_eq!(full, stubs);
    }
}
