//! One call of a `segments = auto` function: its stages run on the environment, cut as
//! the schedule says (every segment but the last through a checkpoint), and the profile
//! of its stages the planner needs on the first training call for an input.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tch::{Device, Tensor};

use super::chain::{FnChain, Stages};
use super::env::{Env, Slot, Slots, StageFn};
use super::names::chain_segment_name;
use super::segment::segment;
use crate::checkpoint::{CheckpointOptions, run_plain};
use crate::plan::{ChainCost, measure_policies, measure_stage, nbytes, probe_checkpoint_bytes};
use crate::{CkptError, memory};

/// Runs the units of `chain` on `env` (`counts`: the number of iterations of each, 1 for a
/// statement), cut as the schedule says for this call: every segment but the last through
/// a checkpoint, the last inline, and so are the segments the planner keeps and the runs
/// of `#[ckpt::keep]` statements (once, with grad, between the checkpointed ones). For `segments = auto` / `budget`, the first training
/// call for an input profiles and plans (`tail_probe`, the last statement as a closure
/// that puts its value into the chain's `tail_out` slot, is profiled as the last stage);
/// without grad, or inside a recompute when no plan is cached, every stage runs inline.
///
/// # Panics
///
/// When planning fails (an impossible budget: the message states the smallest feasible
/// one) or a checkpointed segment fails in forward, with the error's message (tch's
/// convention for calls that do not return `Result`).
#[allow(clippy::too_many_arguments)]
pub fn run_stages(
    chain: &'static FnChain,
    options: &CheckpointOptions,
    owner: Option<String>,
    file: &'static str,
    line: u32,
    mut fns: Vec<StageFn>,
    tail_probe: Option<StageFn>,
    counts: &[usize],
    env: &mut Env,
) {
    // Nested in a segment with a policy, the chain's calls stay out of its cache: this
    // call runs every stage inline without grad and the plan with grad.
    let _off = crate::ffi::OutsidePolicy::enter();
    assert_eq!(fns.len(), chain.units.len(), "ckpt: one closure per unit");
    assert_eq!(counts.len(), chain.units.len(), "ckpt: one count per unit");
    let name = match &owner {
        Some(owner) => format!("{owner}::{}", chain.name),
        None => chain.name.to_owned(),
    };
    let what = format!("{name} ({file}:{line})");
    let probed = chain.probed() && tail_probe.is_some();
    if let (true, Some(probe)) = (probed, tail_probe) {
        // The profile runs it as unit `units.len()`; runs never reach it.
        fns.push(probe);
    }
    let stages = Stages::new(chain, counts, probed);
    let segments = chain
        .segments(options, &stages, &fns, counts, env, &what)
        .unwrap_or_else(|| {
            let whole = 0..stages.len() - usize::from(probed);
            vec![(whole, None)]
        });
    if segments.iter().all(|(_, policy)| policy.is_none()) {
        for (range, _) in &segments {
            for (u, r) in stages.pieces(range) {
                fns[u](env, r);
            }
        }
        return;
    }
    let fns: Arc<[StageFn]> = fns.into();
    let count = segments.len();
    for (k, (range, policy)) in segments.iter().enumerate() {
        let Some(policy) = *policy else {
            // Kept (by the planner or `#[ckpt::keep]`), or the last: inline, with grad.
            for (u, r) in stages.pieces(range) {
                fns[u](env, r);
            }
            continue;
        };
        let (inputs, outputs) = stages.boundary(range);
        let input = Slots(
            inputs
                .iter()
                .map(|&(s, keep)| {
                    let slot = if keep {
                        env.slots[s].as_ref().map(Slot::dup)
                    } else {
                        env.slots[s].take()
                    };
                    (
                        s,
                        slot.expect("ckpt: a segment input is in the environment"),
                    )
                })
                .collect(),
        );
        let seg_name = chain_segment_name(
            owner.clone(),
            chain.name,
            k + 1,
            count,
            (
                range.clone(),
                stages.name(chain, range.start),
                stages.name(chain, range.end - 1),
            ),
            file,
            line,
        );
        let (fns, pieces, slots) = (Arc::clone(&fns), stages.pieces(range), chain.slots);
        let outputs_in = outputs.clone();
        let planned;
        let options = if policy == options.policy {
            options
        } else {
            planned = options.clone().policy(policy);
            &planned
        };
        let out: Slots = segment(
            options,
            seg_name,
            move |input: Slots| {
                let mut local = Env::new(slots);
                for (s, slot) in input.0 {
                    local.slots[s] = Some(slot);
                }
                for (u, r) in &pieces {
                    fns[*u](&mut local, r.clone());
                }
                Slots(
                    outputs_in
                        .iter()
                        .map(|&s| {
                            let slot = local.slots[s].take();
                            (s, slot.expect("ckpt: a segment output was defined"))
                        })
                        .collect(),
                )
            },
            input,
        );
        for (s, slot) in out.0 {
            env.slots[s] = Some(slot);
        }
    }
}

/// Bytes of the distinct storages among `tensors`, leaving out those in `skip`.
fn storage_bytes<'a>(tensors: impl Iterator<Item = &'a Tensor>, skip: &HashSet<usize>) -> u64 {
    let mut seen: HashMap<usize, u64> = HashMap::new();
    for t in tensors {
        if !t.defined() || t.numel() == 0 {
            continue;
        }
        let key = storage_key(t);
        if skip.contains(&key) {
            continue;
        }
        let b = nbytes(t);
        let e = seen.entry(key).or_insert(0);
        *e = (*e).max(b);
    }
    seen.values().sum()
}

fn storage_key(t: &Tensor) -> usize {
    let offset = t.storage_offset().max(0) as usize * t.kind().elt_size_in_bytes();
    (t.data_ptr() as usize).wrapping_sub(offset)
}

/// The [`ChainCost`] of the stages on `env` (see [`profile_chain`](crate::plan::profile_chain)
/// for the method): per stage (a statement, or one iteration of a layer loop), on detached
/// copies of the slots it uses. A stage's input bytes are those of every value live at
/// its start (distinct storages), less the arguments' tensors, which the caller holds.
pub(super) fn profile_env(
    chain: &FnChain,
    stages: &Stages,
    options: &CheckpointOptions,
    fns: &[StageFn],
    env: &Env,
) -> Result<ChainCost, CkptError> {
    let device = env
        .tensors()
        .find(|t| t.defined())
        .map_or(Device::Cpu, Tensor::device);
    memory::f_stats(device)?;
    // As `profile::profile`: the random streams must not notice the profiling runs.
    let _rng = crate::ffi::RngFork::new();
    // Nor batch norm's running statistics: the real step updates them, once.
    let _stats = crate::ffi::FrozenRunningStats::new();
    let args: HashSet<usize> = env
        .tensors()
        .filter(|t| t.defined())
        .map(storage_key)
        .collect();
    let live = &stages.used_from;
    let mut cur = Env::new(chain.slots);
    for (s, slot) in env.slots.iter().enumerate() {
        if let Some(slot) = slot {
            cur.slots[s] = Some(slot.detached(false));
        }
    }
    let mut out = Vec::with_capacity(stages.len());
    for i in 0..stages.len() {
        let (u, iteration) = stages.at[i];
        let stage = &fns[u];
        let live_here = cur
            .slots
            .iter()
            .enumerate()
            .filter(|(s, _)| live[i][*s])
            .filter_map(|(_, slot)| slot.as_ref())
            .flat_map(|s| &s.tensors);
        let input_bytes = storage_bytes(live_here, &args);
        let local = |leaf: bool| {
            let mut e = Env::new(chain.slots);
            for &s in stages.uses[i] {
                if let Some(slot) = &cur.slots[s] {
                    e.slots[s] = Some(slot.detached(leaf));
                }
            }
            e
        };
        let mut run = Some(local(true));
        let leaves: Vec<Tensor> = run
            .iter()
            .flat_map(Env::tensors)
            .map(Tensor::shallow_clone)
            .collect();
        let defs = stages.defs[i];
        let (done, fig): (Env, _) = measure_stage(
            device,
            |warm| {
                let mut e = if warm {
                    local(false)
                } else {
                    run.take().unwrap_or_else(|| local(true))
                };
                stage(&mut e, iteration..iteration + 1);
                e
            },
            |e| {
                defs.iter()
                    .filter_map(|&s| e.slots[s].as_ref())
                    .flat_map(|s| s.tensors.iter().map(Tensor::shallow_clone))
                    .collect()
            },
            &leaves,
        )?;
        // What the stage keeps and costs to recompute under the masks, narrowing and selective
        // policies, as `plan::profile_sequential` measures a model's stage.
        let policies = measure_policies(device, |leaf| {
            let mut e = local(leaf);
            run_plain(
                || format!("{} profiling, stage {i} (policies)", chain.name),
                || stage(&mut e, iteration..iteration + 1),
            )
            .map(|()| e)
        });
        out.push(fig.cost(input_bytes, policies));
        for &s in defs {
            if let Some(slot) = &done.slots[s] {
                cur.slots[s] = Some(slot.detached(false));
            }
        }
        for (s, slot) in cur.slots.iter_mut().enumerate() {
            if !live[i + 1][s] {
                *slot = None;
            }
        }
    }
    let output_bytes = storage_bytes(cur.tensors(), &args);
    Ok(ChainCost {
        stages: out,
        output_bytes,
        checkpoint_bytes: probe_checkpoint_bytes(options, device)?,
    })
}
