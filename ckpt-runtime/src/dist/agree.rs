//! Agreement between ranks before a collective: every rank must call the same collective
//! on tensors of the same dtype and shape (and the same root or reduction). c10d's Gloo
//! backend cannot check that itself, and a mismatch aborts a process in Gloo's transport
//! thread (`gloo::EnforceNotMet`, uncatchable) or exchanges garbage; PyTorch checks it
//! only under `TORCH_DISTRIBUTED_DEBUG=DETAIL` (its `ProcessGroupWrapper`, which
//! all-gathers each collective's fingerprint first). Here every collective of
//! [`ProcessGroup`] checks the same, always, with one all-reduce (maximum) of
//! 2 x [`FINGERPRINT`] int64s (the fingerprint and its negation: each slot's maximum and
//! minimum over the ranks), so a mismatch is a [`CkptError::Dist`] on every rank, naming
//! what differs. [`InitOptions::check_collectives`](super::InitOptions::check_collectives)
//! turns it off.

use tch::{Kind, Tensor};

use super::ProcessGroup;
use crate::CkptError;

/// The dtypes [`kind_code`] names; others are coded by a hash of their name.
const KINDS: [Kind; 13] = [
    Kind::Uint8,
    Kind::Int8,
    Kind::Int16,
    Kind::Int,
    Kind::Int64,
    Kind::Half,
    Kind::Float,
    Kind::Double,
    Kind::ComplexHalf,
    Kind::ComplexFloat,
    Kind::ComplexDouble,
    Kind::Bool,
    Kind::BFloat16,
];

/// A number for `kind`, the same on every rank.
pub(super) fn kind_code(kind: Kind) -> i64 {
    match KINDS.iter().position(|k| *k == kind) {
        Some(i) => i as i64,
        // FNV-1a of the name, kept above the indices of `KINDS`.
        None => {
            let h = format!("{kind:?}")
                .bytes()
                .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
                });
            1000 + (h % 1_000_000_000) as i64
        }
    }
}

/// The name of the dtype `code` stands for.
pub(super) fn kind_name(code: i64) -> String {
    usize::try_from(code)
        .ok()
        .and_then(|i| KINDS.get(i))
        .map_or_else(|| format!("dtype #{code}"), |k| format!("{k:?}"))
}

/// Length of a collective's fingerprint: collective, root or reduction, dtype, number of
/// dimensions, number of elements, then up to [`DIMS`] sizes (the last slot folds in any
/// further sizes).
pub(super) const FINGERPRINT: usize = 5 + DIMS;

/// Sizes a fingerprint spells out one by one.
const DIMS: usize = 8;

/// The collectives, numbered for the fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Collective {
    AllReduce,
    Broadcast,
    AllGather,
    ReduceScatter,
}

impl Collective {
    fn name(code: i64) -> &'static str {
        match code {
            0 => "all_reduce",
            1 => "broadcast",
            2 => "all_gather",
            3 => "reduce_scatter",
            _ => "another collective",
        }
    }
}

/// The fingerprint of `collective` on `t` with `arg` (the reduction's code or the root).
fn fingerprint(collective: Collective, arg: i64, t: &Tensor) -> [i64; FINGERPRINT] {
    let mut f = [-1; FINGERPRINT];
    let size = t.size();
    f[0] = collective as i64;
    f[1] = arg;
    f[2] = kind_code(t.kind());
    f[3] = size.len() as i64;
    f[4] = t.numel() as i64;
    for (slot, d) in f[5..].iter_mut().zip(&size) {
        *slot = *d;
    }
    if size.len() > DIMS {
        // Fold the sizes past the slots into the last one (order-sensitive).
        f[FINGERPRINT - 1] = size[DIMS - 1..]
            .iter()
            .fold(17i64, |h, d| h.wrapping_mul(1_000_003).wrapping_add(*d));
    }
    f
}

/// What a fingerprint says, for a message: `all_reduce of Float [2, 3] (reduction 0)`.
fn describe(f: &[i64]) -> String {
    let dims = usize::try_from(f[3]).unwrap_or(0);
    let sizes: Vec<String> = f[5..5 + dims.min(DIMS)]
        .iter()
        .map(i64::to_string)
        .collect();
    let more = if dims > DIMS { ", .." } else { "" };
    let arg = match f[0] {
        1 => format!(" from root {}", f[1]),
        2 => String::new(),
        _ => format!(" (reduction {})", super::ReduceOp::name_of(f[1])),
    };
    format!(
        "{} of {} [{}{more}]{arg}",
        Collective::name(f[0]),
        kind_name(f[2]),
        sizes.join(", ")
    )
}

/// The aspects of a fingerprint that differ between `max` and `min` (slot-wise maximum
/// and minimum over the ranks), each with its range: `dtype (Float to Double)`.
fn disagreements(max: &[i64], min: &[i64]) -> Vec<String> {
    let mut out = Vec::new();
    for i in (0..FINGERPRINT).filter(|&i| max[i] != min[i]) {
        let (lo, hi) = (min[i], max[i]);
        out.push(match i {
            0 => format!(
                "collective ({} to {})",
                Collective::name(lo),
                Collective::name(hi)
            ),
            1 => format!("root or reduction ({lo} to {hi})"),
            2 => format!("dtype ({} to {})", kind_name(lo), kind_name(hi)),
            3 => format!("number of dimensions ({lo} to {hi})"),
            4 => format!("number of elements ({lo} to {hi})"),
            _ => format!("size of dimension {} ({lo} to {hi})", i - 5),
        });
    }
    out
}

impl ProcessGroup {
    /// Checks that every rank calls `collective` with the same `arg` on a tensor of `t`'s
    /// dtype and shape (see the [module docs](self)): one all-reduce (maximum) of the
    /// fingerprint and its negation gives each slot's maximum and minimum over the ranks,
    /// which agree only when every rank passed the same.
    ///
    /// # Errors
    ///
    /// [`CkptError::Dist`] on every rank when the ranks disagree (naming what differs and
    /// over which range), or when the exchange itself fails (a timeout, a rank gone).
    pub(super) fn agree(
        &self,
        collective: Collective,
        arg: i64,
        t: &Tensor,
    ) -> Result<(), CkptError> {
        if !self.options().check_collectives {
            return Ok(());
        }
        let mine = fingerprint(collective, arg, t);
        let mut both: Vec<i64> = mine.to_vec();
        both.extend(mine.iter().map(|v| v.wrapping_neg()));
        let _g = tch::no_grad_guard();
        let exchanged = Tensor::from_slice(&both).to_device(t.device());
        self.raw()
            .all_reduce(&exchanged, super::ReduceOp::Max.code())?;
        let r = Vec::<i64>::try_from(&exchanged.to_device(tch::Device::Cpu))
            .map_err(|e| CkptError::Dist(e.to_string()))?;
        let (max, neg_min) = r.split_at(FINGERPRINT);
        let min: Vec<i64> = neg_min.iter().map(|v| v.wrapping_neg()).collect();
        let differ = disagreements(max, &min);
        if differ.is_empty() {
            return Ok(());
        }
        Err(CkptError::Dist(format!(
            "every rank must make the same collective call, on tensors of the same dtype and \
             shape, but the ranks disagree on the {}; rank {} calls {}",
            differ.join(", "),
            self.rank(),
            describe(&mine)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn reduce_op_codes_are_the_ones_dist_cpp_reads_and_name_back() {
        use super::super::ReduceOp;
        let ops = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];
        let codes: Vec<i32> = ops.iter().map(|op| op.code()).collect();
        assert_eq!(codes, [0, 1, 2, 3]);
        let names: Vec<&str> = [0, 1, 2, 3, 4, -1].map(ReduceOp::name_of).to_vec();
        assert_eq!(names, ["Sum", "Avg", "Max", "Min", "unknown", "unknown"]);
    }

    #[test]
    fn fingerprints_tell_apart_what_gloo_cannot() {
        let t = |shape: &[i64], kind| Tensor::zeros(shape, (kind, Device::Cpu));
        let base = fingerprint(Collective::AllReduce, 0, &t(&[2, 3], Kind::Float));
        for other in [
            fingerprint(Collective::AllReduce, 0, &t(&[3, 2], Kind::Float)),
            fingerprint(Collective::AllReduce, 0, &t(&[2, 3], Kind::Double)),
            fingerprint(Collective::AllReduce, 2, &t(&[2, 3], Kind::Float)),
            fingerprint(Collective::Broadcast, 0, &t(&[2, 3], Kind::Float)),
            fingerprint(Collective::AllReduce, 0, &t(&[6], Kind::Float)),
        ] {
            assert_ne!(base, other);
        }
        assert_eq!(
            base,
            fingerprint(Collective::AllReduce, 0, &t(&[2, 3], Kind::Float))
        );
        // Sizes past the spelled-out slots still count.
        let long = |last| {
            fingerprint(
                Collective::AllGather,
                0,
                &t(&[1, 1, 1, 1, 1, 1, 1, 1, 1, last], Kind::Float),
            )
        };
        assert_ne!(long(2), long(3));
        assert_eq!(
            describe(&base),
            "all_reduce of Float [2, 3] (reduction Sum)"
        );
        assert_eq!(
            describe(&fingerprint(
                Collective::Broadcast,
                1,
                &t(&[4], Kind::Int64)
            )),
            "broadcast of Int64 [4] from root 1"
        );
    }
}
