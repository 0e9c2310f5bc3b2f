//! Rules spanning several items: unique names, per-call values before the stages, at
//! least one stage, reserved names, and `#[keep]` stages only where a schedule cuts
//! around them.

use std::collections::HashSet;

use super::ast::{Item, Model};
use crate::ctxt::Ctxt;

/// Names a per-call value cannot take: what it sees of the forward call.
const LET_RESERVED: [&str; 2] = ["xs", "train"];

/// Checks the declaration, reporting every violation in `cx`.
pub(crate) fn check(model: &Model, cx: &mut Ctxt) {
    let mut fields = HashSet::new();
    let mut lets = HashSet::new();
    let mut seen_stage = false;
    for item in &model.items {
        match item {
            Item::Let(l) => {
                let name = l.ident.to_string();
                if seen_stage {
                    cx.error_spanned_by(
                        &l.ident,
                        format!(
                            "per-call value `{name}` follows a stage; declare `let` values first: they are computed once per call from the model's input `xs`, not from the chain"
                        ),
                    );
                }
                if LET_RESERVED.contains(&name.as_str()) {
                    cx.error_spanned_by(
                        &l.ident,
                        format!(
                            "`{name}` names the forward call's {} in per-call values; choose another name",
                            if name == "xs" {
                                "input (`xs: &Tensor`)"
                            } else {
                                "train flag"
                            }
                        ),
                    );
                } else if !lets.insert(name.clone()) {
                    cx.error_spanned_by(&l.ident, format!("duplicate per-call value `{name}`"));
                }
                reserved(&l.ident, cx);
            }
            Item::Field(f) => {
                let name = f.ident.to_string();
                if !fields.insert(name.clone()) {
                    cx.error_spanned_by(
                        &f.ident,
                        format!(
                            "duplicate field `{name}`: every stage and field needs its own name (it names the struct field and the path of its variables)"
                        ),
                    );
                }
                reserved(&f.ident, cx);
            }
            Item::Builtin(_) | Item::Function(_) | Item::Closure(_) => {}
        }
        seen_stage |= item.is_stage();
    }
    if !model.items.iter().any(Item::is_stage) {
        cx.error_spanned_by(
            &model.ident,
            format!(
                "`{}` has no stage: declare at least one (`fc1: nn::Linear = nn::linear(p, ..)`, `relu`, `|xs| ..`)",
                model.ident
            ),
        );
    }
    check_keeps(model, cx);
}

/// `#[keep]` stages: in a model checkpointed with a fixed schedule, not every stage.
fn check_keeps(model: &Model, cx: &mut Ctxt) {
    let Some((_, _, first)) = model.kept().next() else {
        return;
    };
    let ident = &model.ident;
    if !model.checkpointed {
        cx.error_at(
            first,
            format!(
                "`#[keep]` stores a stage's output instead of recomputing it, but `{ident}` is not checkpointed: every output is stored already; add `#[checkpointed(segments = N)]` to the declaration, or remove `#[keep]`"
            ),
        );
        return;
    }
    // An invalid `#[checkpointed]` is reported already.
    if model.checkpoint.is_none() {
        return;
    }
    let stages = model.items.iter().filter(|i| i.is_stage()).count();
    if model.kept().count() == stages {
        cx.error_at(
            first,
            format!(
                "every stage of `{ident}` is marked `#[keep]`: nothing is left to checkpoint; keep fewer stages, or remove `#[checkpointed]`"
            ),
        );
    }
}

fn reserved(ident: &syn::Ident, cx: &mut Ctxt) {
    if ident.to_string().starts_with("__ckpt") {
        cx.error_spanned_by(
            ident,
            "names starting with `__ckpt` are reserved for `model!`",
        );
    }
}
