//! A fuzz harness over the macros' parse → analyse → expand functions (stable Rust, driven
//! by proptest): random token streams, and mutations of a corpus of valid and invalid
//! inputs (every `#[checkpointed]` function, `model!` declaration and
//! `#[derive(ShallowClone)]` item of the UI tests and of the expansion snapshots' inputs),
//! are expanded; the harness asserts that no expansion panics or takes more than a second
//! of CPU time (wall time would also count a loaded machine), that every rejection comes
//! as `compile_error!` (never a panic), and that an accepted function expands to code that
//! parses.
//!
//! `cargo test -p ckpt-macros fuzz` runs a bounded number of cases (`CKPT_FUZZ_CASES`,
//! default 2,000 per test); `CKPT_FUZZ_SECONDS=3600` keeps drawing for that long instead,
//! and prints the number of cases.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use proc_macro2::{Delimiter, Group, Ident, Literal, Punct, Spacing, Span, TokenStream, TokenTree};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use quote::{ToTokens, quote};

/// One input of a macro.
#[derive(Clone, Debug)]
enum Input {
    /// `#[checkpointed(args)] item`, with whether the item is a method (it is then
    /// expanded inside an `impl`).
    Checkpointed {
        args: TokenStream,
        item: TokenStream,
        method: bool,
    },
    /// `model! { tokens }`.
    Model(TokenStream),
    /// `#[derive(ShallowClone)] item`.
    Derive(TokenStream),
}

/// Expands `input`, panicking (the failure) when an expansion panics.
fn expand(input: &Input) -> TokenStream {
    match input {
        Input::Checkpointed { args, item, .. } => {
            crate::checkpointed::expand(args.clone(), item.clone())
        }
        Input::Model(tokens) => crate::model::expand(tokens.clone()),
        Input::Derive(item) => crate::shallow_clone::expand(item.clone()),
    }
}

fn has_compile_error(tokens: &TokenStream) -> bool {
    tokens.clone().into_iter().any(|tt| match tt {
        TokenTree::Ident(id) => id == "compile_error",
        TokenTree::Group(g) => has_compile_error(&g.stream()),
        _ => false,
    })
}

/// CPU time of the calling thread: a slow expansion is told from a loaded machine (wall
/// time also counts the time the thread waits for a core).
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID is supported on
    // every Linux and macOS the crate builds on. On failure `ts` stays zero, and the bound
    // below then never fires (a lost check, never a false failure).
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Checks one input; `Err` describes a failure.
fn check(input: &Input) -> Result<(), String> {
    let start = thread_cpu_time();
    let out = catch_unwind(AssertUnwindSafe(|| expand(input)))
        .map_err(|_| format!("the expansion panicked on {input:?}"))?;
    let took = thread_cpu_time().saturating_sub(start);
    if took > Duration::from_secs(1) {
        return Err(format!(
            "the expansion took {took:?} of CPU time on {input:?}"
        ));
    }
    // An accepted `#[checkpointed]` function whose input parses must expand to code that
    // parses (inside an `impl` for a method).
    if let Input::Checkpointed { item, method, .. } = input
        && !has_compile_error(&out)
        && syn::parse2::<syn::ImplItemFn>(item.clone()).is_ok()
    {
        let parses = if *method {
            syn::parse2::<syn::File>(quote!(impl Model { #out })).is_ok()
        } else {
            syn::parse2::<syn::File>(out.clone()).is_ok()
        };
        if !parses {
            return Err(format!(
                "the expansion does not parse: {out}\ninput: {input:?}"
            ));
        }
    }
    Ok(())
}

/// The corpus: the macro inputs of the UI tests (pass and fail cases).
fn corpus() -> Vec<Input> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui-tests/ui");
    let mut out = Vec::new();
    for sub in ["pass", "fail", "model-pass", "model-fail"] {
        let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        {
            let Ok(text) = std::fs::read_to_string(path) else {
                continue;
            };
            if let Ok(file) = syn::parse_file(&text) {
                collect(&file.items, &mut out);
            }
        }
    }
    out
}

fn is_named(path: &syn::Path, name: &str) -> bool {
    path.segments.last().is_some_and(|s| s.ident == name)
}

fn collect(items: &[syn::Item], out: &mut Vec<Input>) {
    for item in items {
        match item {
            syn::Item::Fn(f) => {
                if let Some((args, item)) = checkpointed_fn(&f.attrs, f.to_token_stream()) {
                    out.push(Input::Checkpointed {
                        args,
                        item,
                        method: false,
                    });
                }
            }
            syn::Item::Impl(imp) => {
                for it in &imp.items {
                    if let syn::ImplItem::Fn(f) = it
                        && let Some((args, item)) = checkpointed_fn(&f.attrs, f.to_token_stream())
                    {
                        out.push(Input::Checkpointed {
                            args,
                            item,
                            method: true,
                        });
                    }
                }
            }
            syn::Item::Macro(m) if is_named(&m.mac.path, "model") => {
                out.push(Input::Model(m.mac.tokens.clone()));
            }
            syn::Item::Struct(s) if derives_shallow_clone(&s.attrs) => {
                out.push(Input::Derive(strip_attrs(s.to_token_stream())));
            }
            syn::Item::Enum(e) if derives_shallow_clone(&e.attrs) => {
                out.push(Input::Derive(strip_attrs(e.to_token_stream())));
            }
            syn::Item::Mod(m) => {
                if let Some((_, items)) = &m.content {
                    collect(items, out);
                }
            }
            _ => {}
        }
    }
}

/// The arguments of a `#[checkpointed]` attribute among `attrs`, and the item without it.
fn checkpointed_fn(
    attrs: &[syn::Attribute],
    item: TokenStream,
) -> Option<(TokenStream, TokenStream)> {
    let attr = attrs.iter().find(|a| is_named(a.path(), "checkpointed"))?;
    let args = match &attr.meta {
        syn::Meta::List(l) => l.tokens.clone(),
        _ => TokenStream::new(),
    };
    let mut f: syn::ImplItemFn = syn::parse2(item).ok()?;
    f.attrs.retain(|a| !is_named(a.path(), "checkpointed"));
    Some((args, f.to_token_stream()))
}

fn derives_shallow_clone(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("derive") && a.to_token_stream().to_string().contains("ShallowClone")
    })
}

/// The item without its `#[derive(..)]` attributes (the derive gets the rest).
fn strip_attrs(item: TokenStream) -> TokenStream {
    let mut parsed: syn::DeriveInput = match syn::parse2(item.clone()) {
        Ok(p) => p,
        Err(_) => return item,
    };
    parsed.attrs.retain(|a| !a.path().is_ident("derive"));
    parsed.to_token_stream()
}

/// Identifiers the mutations draw from: keywords and names the macros treat specially.
const IDENTS: &[&str] = &[
    "self", "Self", "let", "mut", "for", "in", "fold", "apply", "apply_t", "forward", "return",
    "break", "continue", "loop", "while", "if", "else", "match", "async", "unsafe", "move", "ref",
    "xs", "x", "h", "blocks", "train", "segments", "auto", "budget", "Tensor", "Option", "ckpt",
    "cut", "allow", "keep", "relu_", "push", "lock", "take", "fn", "struct", "field", "p", "_",
    "r#for", "impl", "dyn", "where",
];
const PUNCTS: &[char] = &[
    ';', ',', '.', '=', '&', '*', '?', '!', ':', '#', '|', '-', '+', '<', '>', '\'',
];

/// A random token tree of depth at most `depth`.
fn random_tree(rng: &mut TestRng, depth: u32) -> TokenTree {
    match rng.random_range(0..10) {
        0..=3 => {
            let name = IDENTS[rng.random_range(0..IDENTS.len())];
            TokenTree::Ident(match name.strip_prefix("r#") {
                Some(raw) => Ident::new_raw(raw, Span::call_site()),
                None => Ident::new(name, Span::call_site()),
            })
        }
        4..=5 => TokenTree::Punct(Punct::new(
            PUNCTS[rng.random_range(0..PUNCTS.len())],
            if rng.random_bool(0.3) {
                Spacing::Joint
            } else {
                Spacing::Alone
            },
        )),
        6 => match rng.random_range(0..3) {
            0 => TokenTree::Literal(Literal::usize_unsuffixed(rng.random_range(0..5))),
            1 => TokenTree::Literal(Literal::string(
                ["40%", "1 KiB", "x"][rng.random_range(0..3)],
            )),
            _ => TokenTree::Literal(Literal::f64_unsuffixed(0.5)),
        },
        _ if depth == 0 => TokenTree::Ident(Ident::new("xs", Span::call_site())),
        _ => {
            let delim = [Delimiter::Parenthesis, Delimiter::Brace, Delimiter::Bracket]
                [rng.random_range(0..3)];
            let n = rng.random_range(0..6);
            let inner: TokenStream = (0..n).map(|_| random_tree(rng, depth - 1)).collect();
            TokenTree::Group(Group::new(delim, inner))
        }
    }
}

/// A random mutation of `tokens` (at the top level, or inside a random group).
fn mutate(rng: &mut TestRng, tokens: TokenStream) -> TokenStream {
    let mut tts: Vec<TokenTree> = tokens.into_iter().collect();
    // Descend into a group half of the time.
    let groups: Vec<usize> = (0..tts.len())
        .filter(|&i| matches!(tts[i], TokenTree::Group(_)))
        .collect();
    if !groups.is_empty() && rng.random_bool(0.6) {
        let i = groups[rng.random_range(0..groups.len())];
        if let TokenTree::Group(g) = &tts[i] {
            let mut new = Group::new(g.delimiter(), mutate(rng, g.stream()));
            new.set_span(g.span());
            tts[i] = TokenTree::Group(new);
        }
        return tts.into_iter().collect();
    }
    let n = tts.len();
    let at = if n == 0 { 0 } else { rng.random_range(0..n) };
    match rng.random_range(0..9) {
        0 if n > 0 => {
            tts.remove(at);
        }
        1 if n > 0 => {
            let t = tts[at].clone();
            tts.insert(at, t);
        }
        2 if n > 1 => tts.swap(at, (at + 1) % n),
        3 => tts.insert(at, random_tree(rng, 2)),
        4 if n > 0 => tts[at] = random_tree(rng, 1),
        5 => {
            let stmt: TokenStream = quote!(ckpt::cut!(););
            for (k, tt) in stmt.into_iter().enumerate() {
                tts.insert(at + k, tt);
            }
        }
        6 => {
            let attr: TokenStream = if rng.random_bool(0.5) {
                quote!(#[ckpt::allow(io)])
            } else {
                quote!(#[ckpt::keep])
            };
            for (k, tt) in attr.into_iter().enumerate() {
                tts.insert(at + k, tt);
            }
        }
        7 if n > 1 => {
            // Wrap a run of tokens in a new group.
            let end = (at + rng.random_range(1..4)).min(n);
            let inner: TokenStream = tts.drain(at..end).collect();
            tts.insert(at, TokenTree::Group(Group::new(Delimiter::Brace, inner)));
        }
        _ if n > 0 => {
            // Unwrap a group, or duplicate a run (a repeated statement).
            if let TokenTree::Group(g) = tts[at].clone() {
                tts.remove(at);
                for (k, tt) in g.stream().into_iter().enumerate() {
                    tts.insert(at + k, tt);
                }
            } else {
                let end = (at + 4).min(n);
                let run: Vec<TokenTree> = tts[at..end].to_vec();
                for (k, tt) in run.into_iter().enumerate() {
                    tts.insert(end + k, tt);
                }
            }
        }
        _ => tts.push(random_tree(rng, 2)),
    }
    tts.into_iter().collect()
}

/// Applies 1 to 4 mutations to a random part of the input.
fn mutated(rng: &mut TestRng, input: &Input) -> Input {
    let times = rng.random_range(1..5);
    let mut input = input.clone();
    for _ in 0..times {
        input = match input {
            Input::Checkpointed { args, item, method } => {
                if rng.random_bool(0.2) {
                    Input::Checkpointed {
                        args: mutate(rng, args),
                        item,
                        method,
                    }
                } else {
                    Input::Checkpointed {
                        args,
                        item: mutate(rng, item),
                        method,
                    }
                }
            }
            Input::Model(t) => Input::Model(mutate(rng, t)),
            Input::Derive(t) => Input::Derive(mutate(rng, t)),
        };
    }
    input
}

/// The number of cases per test, or the duration to keep drawing for.
fn budget() -> (usize, Option<Duration>) {
    let cases = std::env::var("CKPT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let seconds = std::env::var("CKPT_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_secs);
    (cases, seconds)
}

fn rng(seed: u64) -> TestRng {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let seed = std::env::var("CKPT_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(seed);
    bytes[8..16].copy_from_slice(&seed.to_le_bytes());
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

/// Runs `case` for the budget; returns the number of cases run.
fn drive(mut case: impl FnMut(&mut TestRng) -> Result<(), String>, seed: u64) -> usize {
    let (cases, seconds) = budget();
    let mut rng = rng(seed);
    let start = Instant::now();
    let mut n = 0;
    loop {
        let done = match seconds {
            Some(limit) => start.elapsed() >= limit,
            None => n >= cases,
        };
        if done {
            break;
        }
        if let Err(e) = case(&mut rng) {
            panic!("fuzz case {n} failed: {e}");
        }
        n += 1;
    }
    n
}

#[test]
fn the_corpus_is_large_enough() {
    let corpus = corpus();
    let count = |f: fn(&Input) -> bool| corpus.iter().filter(|i| f(i)).count();
    assert!(count(|i| matches!(i, Input::Checkpointed { .. })) >= 60);
    assert!(count(|i| matches!(i, Input::Model(_))) >= 30);
    assert!(count(|i| matches!(i, Input::Derive(_))) >= 20);
    for input in &corpus {
        check(input).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn mutated_inputs_expand_without_panics() {
    let corpus = corpus();
    // Panics are caught and reported; keep the default hook from printing each one.
    let n = drive(
        |rng| {
            let input = &corpus[rng.random_range(0..corpus.len())];
            check(&mutated(rng, input))
        },
        1,
    );
    println!("fuzz: {n} mutated inputs expanded");
}

#[test]
fn random_token_streams_expand_without_panics() {
    let n = drive(
        |rng| {
            let len = rng.random_range(0..24);
            let tokens: TokenStream = (0..len).map(|_| random_tree(rng, 3)).collect();
            let input = match rng.random_range(0..4) {
                0 => Input::Model(tokens),
                1 => Input::Derive(tokens),
                _ => {
                    let args: TokenStream = (0..rng.random_range(0..4))
                        .map(|_| random_tree(rng, 1))
                        .collect();
                    Input::Checkpointed {
                        args,
                        item: quote!(fn f(&self, xs: &Tensor) -> Tensor { #tokens }),
                        method: true,
                    }
                }
            };
            check(&input)
        },
        2,
    );
    println!("fuzz: {n} random token streams expanded");
}

/// Keeps `proptest`'s own strategy machinery in the harness's reach (the mutations above
/// draw from its RNG); a generated structurally valid function, mutated.
#[test]
fn generated_functions_expand_without_panics() {
    let mut runner = TestRunner::new_with_rng(Config::default(), rng(3));
    let stmt = (0usize..4, 0usize..4, any::<bool>());
    let strategy = proptest::collection::vec(stmt, 1..10);
    let n = drive(
        |rng| {
            let stmts = strategy
                .new_tree(&mut runner)
                .map_err(|e| e.to_string())?
                .current();
            let body: Vec<TokenStream> = stmts
                .iter()
                .map(|(target, src, looped)| {
                    let t = Ident::new(["a", "b", "c", "d"][*target], Span::call_site());
                    let s = Ident::new(["xs", "a", "b", "c"][*src], Span::call_site());
                    if *looped {
                        quote!(for blk in self.blocks.iter() { #t = blk.forward(&#s); })
                    } else {
                        quote!(let mut #t = #s.apply(&self.l).relu();)
                    }
                })
                .collect();
            let item = quote!(fn f(&self, xs: &Tensor) -> Tensor { #(#body)* xs.shallow_clone() });
            let args = [quote!(segments = 2), quote!(), quote!(segments = auto)]
                [rng.random_range(0..3)]
            .clone();
            let input = Input::Checkpointed {
                args,
                item,
                method: true,
            };
            check(&mutated(rng, &input))
        },
        3,
    );
    println!("fuzz: {n} generated functions expanded");
}
