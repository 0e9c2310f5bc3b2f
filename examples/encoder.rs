//! Builds the transformer encoder classifier of [`ckpt_models::encoder`] (6 pre-LN blocks,
//! 4 heads, d_model 256, feed-forward 1024) twice, declared with [`ckpt::model!`] and as a
//! hand-written loop under `#[checkpointed(segments = 3)]`, with the same weights, and
//! measures a training step of each.
//!
//! ```text
//! cargo run --release --example encoder
//! ```

use anyhow::Result;
use ckpt_models::encoder::{Config, Encoder, HandEncoder};
use tch::nn::{self, ModuleT};
use tch::{Device, Kind, Tensor};

/// Builds the model (6 layers, 4 heads, d_model 256) both ways with the same weights and
/// runs a training step (forward, cross-entropy, backward) on a batch of random token ids
/// with padded tails: the `model!` one plain (`set_segments(1)`) and checkpointed (its
/// declared 3 segments), the hand-written one checkpointed (its `segments = 3`). Prints
/// the losses (equal: same weights, same dropout masks) and each step's peak tensor
/// memory.
fn main() -> Result<()> {
    tch::manual_seed(0);
    let c = Config {
        vocab: 1000,
        classes: 10,
        seq_len: 128,
        layers: 6,
        heads: 4,
        d_model: 256,
        ff: 1024,
        dropout: 0.1,
    };
    let (batch, device) = (16, Device::Cpu);
    let vs = nn::VarStore::new(device);
    let mut model = Encoder::new(vs.root(), &c);
    let mut hand_vs = nn::VarStore::new(device);
    let hand = HandEncoder::new(hand_vs.root(), &c);
    hand_vs.copy(&vs)?;

    // Random ids, each row padded after a random length in 8..=seq_len.
    let ids = Tensor::randint_low(1, c.vocab, [batch, c.seq_len], (Kind::Int64, device));
    let lengths = Tensor::randint_low(8, c.seq_len + 1, [batch, 1], (Kind::Int64, device));
    let positions = Tensor::arange(c.seq_len, (Kind::Int64, device)).unsqueeze(0);
    let ids = ids.masked_fill(&positions.ge_tensor(&lengths), 0);
    let labels = Tensor::randint(c.classes, [batch], (Kind::Int64, device));

    // One step, from the same dropout masks each time; the first call of each model
    // allocates its parameters' gradients, so the second is measured.
    let step = |vs: &nn::VarStore, forward: &dyn Fn() -> Tensor| {
        let run = || {
            vs.trainable_variables().iter().for_each(|v| {
                let _ = v.grad().f_zero_();
            });
            tch::manual_seed(1);
            ckpt::memory::measure(device, || {
                let loss = forward().cross_entropy_for_logits(&labels);
                loss.backward();
                loss.double_value(&[])
            })
        };
        run();
        run()
    };
    model.set_segments(1)?;
    let (plain_loss, plain) = step(&vs, &|| model.forward_t(&ids, true));
    model.set_segments(3)?;
    let (ckpt_loss, ckpt) = step(&vs, &|| model.forward_t(&ids, true));
    let (hand_loss, hand_peak) = step(&hand_vs, &|| hand.forward_t(&ids, true));

    let params: usize = vs.trainable_variables().iter().map(Tensor::numel).sum();
    let mib = |r: ckpt::memory::PeakReport| r.peak_above_baseline_bytes as f64 / 1048576.0;
    println!(
        "{} blocks, {params} parameters, batch {batch}, seq {}",
        c.layers, c.seq_len
    );
    println!(
        "model!, plain:                          loss {plain_loss:.6}, peak {:.1} MiB",
        mib(plain)
    );
    println!(
        "model!, segments = 3:                   loss {ckpt_loss:.6}, peak {:.1} MiB ({:.3} of plain)",
        mib(ckpt),
        mib(ckpt) / mib(plain)
    );
    println!(
        "hand-written loop, segments = 3:        loss {hand_loss:.6}, peak {:.1} MiB ({:.3} of plain)",
        mib(hand_peak),
        mib(hand_peak) / mib(plain)
    );
    anyhow::ensure!(
        plain_loss == ckpt_loss && ckpt_loss == hand_loss,
        "the three steps should compute the same loss"
    );
    Ok(())
}
