//! Data sets as padded token ids, and the two tasks: built-in ListOps and a
//! folder-per-class text corpus.

use std::path::Path;

use anyhow::{Result, ensure};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use tch::{Device, Tensor};

use crate::listops::{self, ListOpsConfig};
use crate::text::{self, VocabConfig};

/// Id of the padding token in both tasks.
pub const PAD: i64 = 0;

/// Examples as fixed-length rows of token ids (`PAD` after the end) and labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataset {
    /// Row-major `[len, seq_len]`.
    pub ids: Vec<i64>,
    /// Class of each row.
    pub labels: Vec<i64>,
    /// Row length.
    pub seq_len: usize,
}

impl Dataset {
    /// Pads (or truncates) each sequence to `seq_len`. A sequence must have at least one
    /// token, so that every row has a key to attend to.
    pub fn new(seqs: &[Vec<i64>], labels: Vec<i64>, seq_len: usize) -> Self {
        assert_eq!(seqs.len(), labels.len());
        let mut ids = vec![PAD; seqs.len() * seq_len];
        for (row, seq) in ids.chunks_mut(seq_len).zip(seqs) {
            assert!(!seq.is_empty(), "an example needs at least one token");
            let n = seq.len().min(seq_len);
            row[..n].copy_from_slice(&seq[..n]);
        }
        Dataset {
            ids,
            labels,
            seq_len,
        }
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the set has no example.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The rows `index` as `([rows, seq_len] int64, [rows] int64)` on `device`.
    pub fn batch(&self, index: &[usize], device: Device) -> (Tensor, Tensor) {
        let s = self.seq_len;
        let mut ids = Vec::with_capacity(index.len() * s);
        let mut labels = Vec::with_capacity(index.len());
        for &i in index {
            ids.extend_from_slice(&self.ids[i * s..(i + 1) * s]);
            labels.push(self.labels[i]);
        }
        let xs = Tensor::from_slice(&ids)
            .view([index.len() as i64, s as i64])
            .to_device(device);
        (xs, Tensor::from_slice(&labels).to_device(device))
    }

    /// Full batches of `batch` rows in a shuffled order drawn from `seed` (the last,
    /// incomplete batch is dropped, so every training step has the same shapes).
    pub fn shuffled_batches(&self, batch: usize, seed: u64) -> Vec<Vec<usize>> {
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
        order.chunks_exact(batch).map(<[usize]>::to_vec).collect()
    }

    /// Fraction of real (non-pad) tokens.
    pub fn fill(&self) -> f64 {
        let real = self.ids.iter().filter(|&&t| t != PAD).count();
        real as f64 / self.ids.len().max(1) as f64
    }
}

/// A classification task: train and test data, vocabulary and class names.
#[derive(Debug, Clone)]
pub struct Task {
    /// `listops` or `text`.
    pub name: &'static str,
    /// One line on where the data came from.
    pub description: String,
    /// Token ids are `0..vocab_size`.
    pub vocab_size: usize,
    /// Class names; labels index them.
    pub classes: Vec<String>,
    /// Training split.
    pub train: Dataset,
    /// Test split.
    pub test: Dataset,
}

/// ListOps with `train_size + test_size` distinct expressions from `seed`: the first
/// `train_size` train, the rest test.
///
/// # Errors
///
/// When an expression cannot fit `seq_len` (`max_length - 1 > seq_len`) or the
/// generator fails (see [`listops::generate`]).
pub fn listops_task(
    cfg: &ListOpsConfig,
    train_size: usize,
    test_size: usize,
    seq_len: usize,
    seed: u64,
) -> Result<Task> {
    ensure!(
        cfg.max_length <= seq_len + 1,
        "--listops-max-length {} does not fit --seq-len {seq_len}: lengths are below the maximum, \
         so it may be at most seq_len + 1",
        cfg.max_length
    );
    let exprs = listops::generate(cfg, train_size + test_size, seed)?;
    let seqs: Vec<Vec<i64>> = exprs.iter().map(listops::Expr::tokens).collect();
    let labels: Vec<i64> = exprs.iter().map(|e| i64::from(e.value())).collect();
    let mean_len = seqs.iter().map(Vec::len).sum::<usize>() as f64 / seqs.len().max(1) as f64;
    Ok(Task {
        name: "listops",
        description: format!(
            "ListOps (seed {seed}): max depth {}, max args {}, {} < length < {} (mean {mean_len:.0} tokens)",
            cfg.max_depth, cfg.max_args, cfg.min_length, cfg.max_length
        ),
        vocab_size: listops::VOCAB.len(),
        classes: (0..10).map(|d| d.to_string()).collect(),
        train: Dataset::new(&seqs[..train_size], labels[..train_size].to_vec(), seq_len),
        test: Dataset::new(&seqs[train_size..], labels[train_size..].to_vec(), seq_len),
    })
}

/// A folder-per-class corpus (see [`text`]): at most `train_size` / `test_size`
/// documents of each split, chosen by a shuffle from `seed`; the vocabulary comes from
/// every training document.
///
/// # Errors
///
/// As [`text::load_corpus`].
pub fn text_task(
    dir: &Path,
    vocab_cfg: &VocabConfig,
    train_size: usize,
    test_size: usize,
    seq_len: usize,
    seed: u64,
) -> Result<Task> {
    let corpus = text::load_corpus(dir)?;
    let vocab = text::Vocab::build(corpus.train.iter().map(|d| d.tokens.as_slice()), vocab_cfg);
    let pick = |docs: &[text::Document], n: usize, seed: u64| -> Dataset {
        let mut order: Vec<usize> = (0..docs.len()).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
        order.truncate(n);
        let seqs: Vec<Vec<i64>> = order
            .iter()
            .map(|&i| vocab.encode(&docs[i].tokens, seq_len))
            .collect();
        let labels = order.iter().map(|&i| docs[i].label as i64).collect();
        Dataset::new(&seqs, labels, seq_len)
    };
    let train = pick(&corpus.train, train_size, seed);
    let test = pick(&corpus.test, test_size, seed.wrapping_add(1));
    Ok(Task {
        name: "text",
        description: format!(
            "{}: {} classes ({}), {} train / {} test documents on disk, vocabulary {} \
             (min frequency {}, max size {}){}",
            dir.display(),
            corpus.classes.len(),
            corpus.classes.join(", "),
            corpus.train.len(),
            corpus.test.len(),
            vocab.len(),
            vocab_cfg.min_freq,
            vocab_cfg.max_size,
            if corpus.skipped.is_empty() {
                String::new()
            } else {
                format!(
                    "; skipped train/{} (no such class in test/)",
                    corpus.skipped.join(", train/")
                )
            }
        ),
        vocab_size: vocab.len(),
        classes: corpus.classes,
        train,
        test,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_truncates_and_batches() {
        let seqs = vec![vec![3, 4, 5], vec![7], vec![1, 2, 3, 4, 5, 6]];
        let d = Dataset::new(&seqs, vec![0, 1, 2], 4);
        assert_eq!(d.ids, [3, 4, 5, PAD, 7, PAD, PAD, PAD, 1, 2, 3, 4]);
        assert_eq!(d.len(), 3);
        let (xs, ys) = d.batch(&[2, 0], Device::Cpu);
        assert_eq!(xs.size(), [2, 4]);
        assert_eq!(
            Vec::<i64>::try_from(xs.flatten(0, -1)).unwrap(),
            [1, 2, 3, 4, 3, 4, 5, 0]
        );
        assert_eq!(Vec::<i64>::try_from(&ys).unwrap(), [2, 0]);
        assert!((d.fill() - 8.0 / 12.0).abs() < 1e-12);
    }

    #[test]
    fn batches_are_full_and_follow_the_seed() {
        let seqs: Vec<Vec<i64>> = (1..=10).map(|i| vec![i]).collect();
        let d = Dataset::new(&seqs, (0..10).collect(), 2);
        let a = d.shuffled_batches(3, 5);
        assert_eq!(a.len(), 3, "the incomplete last batch is dropped");
        assert!(a.iter().all(|b| b.len() == 3));
        assert_eq!(a, d.shuffled_batches(3, 5));
        assert_ne!(a, d.shuffled_batches(3, 6));
    }

    #[test]
    fn listops_task_splits_and_checks_the_length() {
        let cfg = ListOpsConfig {
            max_depth: 10,
            max_args: 10,
            min_length: 8,
            max_length: 33,
        };
        let t = listops_task(&cfg, 20, 5, 32, 3).unwrap();
        assert_eq!((t.train.len(), t.test.len()), (20, 5));
        assert_eq!(t.vocab_size, 16);
        assert_eq!(t.classes.len(), 10);
        assert_eq!(t.train.seq_len, 32);
        let err = listops_task(&cfg, 20, 5, 16, 3).unwrap_err().to_string();
        assert!(err.contains("does not fit --seq-len 16"), "{err}");
    }
}
