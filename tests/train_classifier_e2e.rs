//! End-to-end test of the main program, `examples/train_classifier`: builds it with
//! cargo (the profile of this test), runs its `--quick` path on ListOps and on a tiny
//! folder-per-class corpus written to a temporary folder, and checks the `--json` output.
//! Memory bytes are exact, so they are asserted; times are not.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

/// Builds the example once per test process and returns its path, read from cargo's
/// JSON messages (so `CARGO_TARGET_DIR` and profiles are followed).
fn binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args([
            "build",
            "--example",
            "train_classifier",
            "--message-format=json-render-diagnostics",
        ]);
        if !cfg!(debug_assertions) {
            cmd.arg("--release");
        }
        let out = cmd.stderr(Stdio::inherit()).output().expect("cargo runs");
        assert!(
            out.status.success(),
            "cargo build --example train_classifier failed"
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|m| m["reason"] == "compiler-artifact")
            .filter(|m| m["target"]["name"] == "train_classifier")
            .find_map(|m| m["executable"].as_str().map(PathBuf::from))
            .expect("cargo reports the example's executable")
    })
}

fn run(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .output()
        .expect("the example starts")
}

fn run_ok(args: &[&str], json: &Path) -> (Value, String) {
    let mut all: Vec<&str> = args.to_vec();
    let json_arg = json.to_str().expect("utf-8 temp path");
    all.extend(["--device", "cpu", "--json", json_arg]);
    let out = run(&all);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "train_classifier {all:?} failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(json).expect("the JSON file is written");
    (serde_json::from_str(&text).expect("valid JSON"), stdout)
}

/// Checks the schema and the invariants of a plain-vs-checkpointed comparison.
fn check_comparison(doc: &Value, segments: u64) {
    assert_eq!(doc["device"], "cpu");
    let config = &doc["config"];
    for key in [
        "layers",
        "heads",
        "d_model",
        "seq_len",
        "batch_size",
        "steps",
    ] {
        assert!(config[key].as_u64().unwrap() > 0, "config.{key}: {config}");
    }
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["name"], "plain");
    assert_eq!(runs[0]["segments"], 0);
    assert_eq!(runs[1]["name"], "checkpointed");
    assert_eq!(runs[1]["segments"], segments);
    for run in runs {
        assert!(run["peak_bytes"].as_i64().unwrap() > 0, "{run}");
        assert!(run["step_seconds_median"].as_f64().unwrap() > 0.0);
        assert!(run["epoch_seconds"].as_f64().unwrap() > 0.0);
        let acc = run["test_accuracy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&acc), "accuracy {acc}");
        assert!(run["final_loss"].as_f64().unwrap().is_finite());
    }
    // Same seed, dropout replayed from the saved RNG state, deterministic CPU kernels:
    // the checkpointed run computes exactly the plain run's numbers.
    assert_eq!(doc["grad_max_abs_diff"].as_f64(), Some(0.0));
    assert_eq!(doc["loss_max_abs_diff"].as_f64(), Some(0.0));
    assert_eq!(runs[0]["final_loss"], runs[1]["final_loss"]);
    assert_eq!(runs[0]["test_accuracy"], runs[1]["test_accuracy"]);
}

fn peaks(doc: &Value) -> (f64, f64) {
    let runs = doc["runs"].as_array().unwrap();
    (
        runs[0]["peak_bytes"].as_f64().unwrap(),
        runs[1]["peak_bytes"].as_f64().unwrap(),
    )
}

#[test]
fn quick_listops_run_saves_memory_with_identical_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    let (doc, stdout) = run_ok(&["--quick"], &tmp.path().join("quick.json"));
    assert_eq!(doc["task"], "listops");
    check_comparison(&doc, 3);
    assert_eq!(doc["config"]["layers"], 6);
    let (plain, ckpt) = peaks(&doc);
    // Three segments over six blocks keep two blocks' activations instead of six (plus
    // stashes and gradients): the target is at least 60 % less peak memory, and
    // --quick has the default run's shapes, so the same bytes.
    assert!(
        ckpt <= 0.4 * plain,
        "checkpointed peak {ckpt} bytes vs plain {plain} bytes"
    );
    assert!(stdout.contains("bit-identical"), "{stdout}");
    assert!(stdout.contains("mem saved"), "{stdout}");
}

#[test]
fn sweep_writes_a_csv_and_a_png() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("sweep");
    let mut args = vec!["--sweep", "--quick", "--layers", "3", "--seq-len", "64"];
    args.extend(TINY_DATA);
    args.extend(["--out-dir", out_dir.to_str().unwrap()]);
    let json = tmp.path().join("sweep.json");
    let (doc, _) = run_ok(&args, &json);
    let runs = doc["runs"].as_array().unwrap();
    let segments: Vec<u64> = runs
        .iter()
        .map(|r| r["segments"].as_u64().unwrap())
        .collect();
    assert_eq!(segments, [1, 2, 3]);
    assert_eq!(doc["grad_max_abs_diff"].as_f64(), Some(0.0));
    let csv = std::fs::read_to_string(out_dir.join("sweep.csv")).unwrap();
    assert_eq!(csv.lines().count(), 4, "{csv}");
    assert!(csv.starts_with("segments,peak_bytes,"));
    let png = std::fs::read(out_dir.join("sweep.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG file");
    assert!(
        png.len() > 10_000,
        "the plot has content: {} bytes",
        png.len()
    );
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A tiny two-class corpus in the aclImdb layout.
fn tiny_corpus(dir: &Path) {
    let pos = [
        "a great and moving film",
        "loved it, great acting<br />great story",
    ];
    let neg = [
        "a dull and boring film",
        "awful acting; boring story, I left",
    ];
    for i in 0..12 {
        let k = i % 2;
        write(
            &dir.join(format!("train/pos/{i}_9.txt")),
            &format!("{} {i}", pos[k]),
        );
        write(
            &dir.join(format!("train/neg/{i}_2.txt")),
            &format!("{} {i}", neg[k]),
        );
    }
    for i in 0..4 {
        write(&dir.join(format!("test/pos/{i}_8.txt")), pos[i % 2]);
        write(&dir.join(format!("test/neg/{i}_1.txt")), neg[i % 2]);
    }
    // Unlabelled reviews (as in aclImdb/train/unsup) are skipped.
    write(&dir.join("train/unsup/0_0.txt"), "no label here");
}

#[test]
fn quick_run_on_a_tiny_text_corpus() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("corpus");
    tiny_corpus(&corpus);
    let args = [
        "--quick",
        "--data",
        corpus.to_str().unwrap(),
        "--layers",
        "4",
        "--segments",
        "2",
        "--seq-len",
        "128",
        "--batch-size",
        "8",
        "--min-freq",
        "1",
    ];
    let (doc, stdout) = run_ok(&args, &tmp.path().join("text.json"));
    assert_eq!(doc["task"], "text");
    check_comparison(&doc, 2);
    assert_eq!(doc["config"]["classes"], 2);
    assert_eq!(doc["config"]["train_size"], 24);
    assert_eq!(doc["config"]["test_size"], 8);
    assert_eq!(doc["config"]["steps"], 3);
    // Two segments over four blocks keep two blocks' activations instead of four; the
    // rows are padded to 128 tokens, so activations outweigh the gradients here.
    let (plain, ckpt) = peaks(&doc);
    assert!(
        ckpt < 0.8 * plain,
        "checkpointed peak {ckpt} vs plain {plain}"
    );
    assert!(stdout.contains("neg, pos"), "{stdout}");
}

/// `--policy full --policy masks --policy narrowing --policy selective`: five runs taking
/// turns, the same numbers in each, and peaks ordered by what the checkpointed segments
/// keep (the dropout masks; plus the narrowing Linears' outputs; plus every Linear
/// output; everything, plain). The masks and the small narrowing outputs are freed by the
/// recompute, before the gradients of its segment exist, so they can leave the peak where
/// it was; and a policy's replayed dropouts hold their masks for backward as bits where
/// full recompute's redrawn ones hold their noise, so at this size, whose peak is in a
/// recompute, masks peaks below full.
#[test]
fn policies_keep_the_numbers_and_order_the_peaks() {
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "--quick",
        "--layers",
        "4",
        "--segments",
        "2",
        "--seq-len",
        "64",
        "--batch-size",
        "8",
        "--train-size",
        "16",
        "--test-size",
        "8",
        "--policy",
        "full",
        "--policy",
        "masks",
        "--policy",
        "narrowing",
        "--policy",
        "selective",
    ];
    let (doc, _) = run_ok(&args, &tmp.path().join("policies.json"));
    let runs = doc["runs"].as_array().unwrap();
    let names: Vec<&str> = runs.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "plain",
            "checkpointed",
            "checkpointed",
            "checkpointed",
            "checkpointed"
        ]
    );
    let policies: Vec<&str> = runs.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(
        policies,
        ["none", "full", "masks", "narrowing", "selective"]
    );
    // Every run against the plain one: bit-identical gradients and losses.
    assert_eq!(doc["grad_max_abs_diff"].as_f64(), Some(0.0));
    assert_eq!(doc["loss_max_abs_diff"].as_f64(), Some(0.0));
    let peak: Vec<i64> = runs
        .iter()
        .map(|r| r["peak_bytes"].as_i64().unwrap())
        .collect();
    assert!(
        peak[2] < peak[1]
            && peak[1] < peak[0]
            && peak[2] <= peak[3]
            && peak[3] < peak[4]
            && peak[4] < peak[0],
        "masks < full < plain, masks <= narrowing < selective < plain: {peak:?}"
    );
}

/// `--budget` with `--policy auto`: the planner's cuts and policies within 50 % of the
/// plain run's predicted peak, a fixed policy beside it; the numbers equal the plain
/// run's, the measured peaks lie below plain's; `--policy auto` without a planner is a
/// clear error, and so is a budget that is not one.
#[test]
fn a_budget_run_lets_the_planner_choose_cuts_and_policies() {
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "--quick",
        "--layers",
        "4",
        "--budget",
        "50%",
        "--seq-len",
        "64",
        "--batch-size",
        "8",
        "--train-size",
        "16",
        "--test-size",
        "8",
        "--policy",
        "auto",
        "--policy",
        "full",
        "--explain",
    ];
    let (doc, stdout) = run_ok(&args, &tmp.path().join("budget.json"));
    let runs = doc["runs"].as_array().unwrap();
    let names: Vec<&str> = runs.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["plain", "budget", "budget"]);
    let policies: Vec<&str> = runs.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(policies, ["none", "auto", "full"]);
    assert_eq!(doc["grad_max_abs_diff"].as_f64(), Some(0.0));
    assert_eq!(doc["loss_max_abs_diff"].as_f64(), Some(0.0));
    let peak: Vec<i64> = runs
        .iter()
        .map(|r| r["peak_bytes"].as_i64().unwrap())
        .collect();
    assert!(peak[1] < peak[0] && peak[2] < peak[0], "{peak:?}");
    assert!(
        stdout.contains("budget 50% of the plain run's peak, policies chosen by the planner"),
        "{stdout}"
    );
    // Each planner's run records the plan it trained with: its segments' modes end with
    // the plain one, and a fixed policy's run checkpoints with that policy only.
    assert!(runs[0]["plan"].is_null());
    for (run, allowed) in runs[1..].iter().zip([
        &["kept", "full", "masks", "narrowing", "selective"][..],
        &["kept", "full"][..],
    ]) {
        let plan = &run["plan"];
        let cuts = plan["cuts"].as_array().unwrap();
        let modes: Vec<&str> = plan["modes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_str().unwrap())
            .collect();
        assert_eq!(modes.len(), cuts.len() + 1, "{plan}");
        assert_eq!(modes.last(), Some(&"plain"), "{plan}");
        assert!(
            modes[..cuts.len()].iter().all(|m| allowed.contains(m)),
            "{plan}"
        );
        assert!(plan["predicted_peak_bytes"].as_u64().unwrap() > 0, "{plan}");
    }
    assert!(
        stdout.contains("budget (auto): trained with cuts ["),
        "{stdout}"
    );
    assert!(
        stdout.contains("budget (full): trained with cuts ["),
        "{stdout}"
    );

    let out = run(&["--quick", "--policy", "auto"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "--policy auto lets the planner choose, so it needs --segments auto or --budget"
        ),
        "{err}"
    );
    let out = run(&["--quick", "--budget", "512"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("write bytes with a unit"), "{err}");
    // A budget no plan fits: an error before training, naming the run it is for (the
    // default `--policy full`; the planner's own choice only when asked for).
    let out = run(&[
        "--quick",
        "--layers",
        "2",
        "--seq-len",
        "32",
        "--batch-size",
        "4",
        "--budget",
        "1%",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("budget 1% of the plain run's peak, --policy full")
            && !err.contains("chosen by the planner")
            && err.contains("is too small: the smallest feasible peak"),
        "{err}"
    );
}

#[test]
fn bad_data_folders_are_reported_with_their_path() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-corpus");
    let out = run(&["--quick", "--data", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not a folder") && err.contains("no-such-corpus"),
        "{err}"
    );

    let corpus = tmp.path().join("corpus");
    tiny_corpus(&corpus);
    let empty_class = corpus.join("test/neg");
    std::fs::remove_dir_all(&empty_class).unwrap();
    std::fs::create_dir_all(&empty_class).unwrap();
    let out = run(&["--quick", "--data", corpus.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}: no .txt files", empty_class.display())),
        "{err}"
    );
}

/// `--nproc 2`: both runs train data-parallel on two processes (Gloo on 127.0.0.1), and
/// rank 0 compares each with one process trained on the same global batches.
///
/// The tolerance is zero, and why: with two ranks the Reducer multiplies each rank's
/// gradient by 1/2 and Gloo adds the two, while the reference backpropagates
/// `loss / 2` of each share and autograd adds the two. Scaling by a power of two is exact
/// in float32 (and commutes with every rounding on the way back), and a sum of two
/// values does not depend on its order, so both hold the same bits and AdamW takes the
/// same steps. (With three ranks `1/3` is inexact, and gradients that are mathematically
/// zero, such as the attention's key bias, become rounding noise that AdamW scales to
/// a full `lr` step of either sign: differences of up to `2 * lr * steps`.)
#[test]
fn nproc_2_trains_data_parallel_and_matches_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("ddp.json");
    let mut args = vec!["--nproc", "2", "--threads", "1"];
    args.extend(TINY_MODEL);
    args.extend([
        "--batch-size",
        "8",
        "--train-size",
        "32",
        "--test-size",
        "8",
        "--device",
        "cpu",
        "--json",
    ]);
    let mut child = Command::new(binary())
        .args(args)
        .arg(&json)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the example starts");
    // Bounded: a hung rendezvous or collective fails the test instead of hanging it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("train_classifier --nproc 2 still running after 300 s; killed");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "train_classifier --nproc 2 failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["world_size"], 2);
    assert_eq!(doc["ddp_max_param_diff"].as_f64(), Some(0.0), "{doc}");
    // Plain and checkpointed under DDP still compute the same numbers.
    check_comparison(&doc, 2);
    for run in doc["runs"].as_array().unwrap() {
        assert_eq!(
            run["rows_per_step"], 4,
            "each rank half of the global batch of 8"
        );
        assert_eq!(run["ddp_max_param_diff"].as_f64(), Some(0.0));
        let ranks = run["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), 2);
        for r in ranks {
            // Same shapes on both ranks: the same bytes, but for the small tensors that
            // c10d's threads allocate while the step runs (seen: 4 B and 116 B, from
            // the process-wide counter), whose overlap with the peak depends on timing.
            // A rank doing other work would differ by whole activations and gradients.
            let gap = r["peak_bytes"].as_i64().unwrap() - run["peak_bytes"].as_i64().unwrap();
            assert!(gap.abs() <= 1024, "{run}");
            assert!(r["step_seconds_median"].as_f64().unwrap() > 0.0);
            assert!(r["samples_per_second"].as_f64().unwrap() > 0.0);
        }
    }
    let (plain, ckpt) = peaks(&doc);
    assert!(ckpt < plain, "checkpointing saves memory on each rank too");
    for column in ["rank", "samples/s", "max param diff"] {
        assert!(stdout.contains(column), "table lacks `{column}`:\n{stdout}");
    }
    assert!(
        stdout.contains("largest |parameter difference| against one process: 0e0"),
        "{stdout}"
    );
    // Only rank 0 prints: one table.
    assert_eq!(
        stdout.matches("data-parallel, 2 ranks").count(),
        1,
        "{stdout}"
    );
}

/// A global batch that does not split evenly is refused before any worker starts.
#[test]
fn nproc_that_does_not_divide_the_batch_is_an_error() {
    let out = run(&["--nproc", "3", "--batch-size", "8", "--device", "cpu"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not a multiple of --nproc 3"),
        "stderr:\n{stderr}"
    );
    assert!(out.stdout.is_empty(), "no worker ran");
}

/// A tiny encoder: 2 layers, d_model 32, 2 heads, ff 64, seq 32.
const TINY_MODEL: [&str; 10] = [
    "--layers",
    "2",
    "--d-model",
    "32",
    "--heads",
    "2",
    "--ff",
    "64",
    "--seq-len",
    "32",
];

/// A global batch of 4 rows, 8 training (2 steps) and 4 test examples.
const TINY_DATA: [&str; 6] = ["--batch-size", "4", "--train-size", "8", "--test-size", "4"];

/// The tiny model of the budget-shape tests, a global batch of 4 rows, 2 steps.
fn tiny() -> Vec<&'static str> {
    let mut args = vec!["--quick"];
    args.extend(TINY_MODEL);
    args.extend(TINY_DATA);
    args.extend(["--threads", "1"]);
    args
}

/// `--mode plain` makes no planner's run: a budget no plan fits (1 %) is not its error.
#[test]
fn a_plain_only_run_does_not_plan_its_unused_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = tiny();
    args.extend(["--mode", "plain", "--budget", "1%"]);
    let (doc, _) = run_ok(&args, &tmp.path().join("plain.json"));
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["name"], "plain");
}

/// A data-parallel budget run plans on its rank's share of the global batch, the shape
/// it trains on (here 2 rows of the 4). Measured on this model: the least feasible peak
/// is 444.88 KiB (55.3 % of plain) for 4 rows, 227.38 KiB (56.5 %) for 2 rows. So
/// `300 KiB` fits each rank (it was refused, planned for 4 rows), and `56%` fits 4
/// rows but no rank (it passed the check and then panicked in the first step).
#[test]
fn nproc_2_plans_the_budget_on_each_ranks_share() {
    let tmp = tempfile::tempdir().unwrap();
    let ddp_budget = |budget| {
        let mut args = tiny();
        args.extend(["--nproc", "2", "--mode", "checkpointed", "--budget", budget]);
        args
    };
    let (doc, _) = run_ok(&ddp_budget("300 KiB"), &tmp.path().join("ddp_budget.json"));
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["name"], "budget");
    let mut args = ddp_budget("56%");
    args.extend(["--device", "cpu"]);
    let out = run(&args);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Both ranks write their error at once, so the two may interleave: each part alone.
    assert!(
        stderr.contains("budget 56% of the plain run's peak, --policy full")
            && stderr.contains(
                "memory budget of 225.40 KiB (230809 B, 56.0 % of the plain run's peak) is too \
                 small: the smallest feasible peak of this chain is 227.38 KiB (232832 B, 56."
            ),
        "stderr:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "stderr:\n{stderr}");
}

/// The seq-64 model of the policy tests: 4 layers, a batch of 8, 3 steps.
const SMALL: [&str; 11] = [
    "--quick",
    "--layers",
    "4",
    "--seq-len",
    "64",
    "--batch-size",
    "8",
    "--train-size",
    "24",
    "--test-size",
    "8",
];

/// `--compact-dropout`: the checkpointed runs hold their dropout masks as bits, the plain
/// run stays libtorch's. The numbers stay bit-identical, the plain run's peak does not
/// move, and each checkpointed run's peak drops against the same run without the flag
/// (full recompute's redrawn dropouts and the last segment's hold bits); the JSON marks
/// the runs and gives every run but the first its per-step time ratio to plain.
#[test]
fn compact_dropout_holds_masks_as_bits_with_the_same_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = SMALL.to_vec();
    args.extend(["--segments", "2", "--policy", "full", "--policy", "masks"]);
    let (before, _) = run_ok(&args, &tmp.path().join("noise.json"));
    args.push("--compact-dropout");
    let (doc, stdout) = run_ok(&args, &tmp.path().join("bits.json"));
    assert_eq!(doc["grad_max_abs_diff"].as_f64(), Some(0.0));
    assert_eq!(doc["loss_max_abs_diff"].as_f64(), Some(0.0));
    let runs = doc["runs"].as_array().unwrap();
    let field = |doc: &Value, key: &str| -> Vec<Value> {
        doc["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r[key].clone())
            .collect()
    };
    assert_eq!(field(&doc, "compact_dropout"), [false, true, true]);
    assert_eq!(field(&before, "compact_dropout"), [false, false, false]);
    assert_eq!(field(&doc, "final_loss"), field(&before, "final_loss"));
    let peak = |doc: &Value| -> Vec<i64> {
        field(doc, "peak_bytes")
            .iter()
            .map(|p| p.as_i64().unwrap())
            .collect()
    };
    let (bits, noise) = (peak(&doc), peak(&before));
    assert_eq!(bits[0], noise[0], "plain's peak moved");
    assert!(
        bits[1] < noise[1] && bits[2] < noise[2],
        "{bits:?} vs {noise:?}"
    );
    assert!(runs[0]["step_ratio"].is_null());
    for run in &runs[1..] {
        let r = &run["step_ratio"];
        assert_eq!(r["steps"], 2, "{r}");
        let (q1, m, q3) = (
            r["q1"].as_f64().unwrap(),
            r["median"].as_f64().unwrap(),
            r["q3"].as_f64().unwrap(),
        );
        assert!(0.0 < q1 && q1 <= m && m <= q3, "{r}");
    }
    assert!(
        stdout.contains("checkpointed (masks): step time / plain's, step by step (interleaved, steps 2-3): median"),
        "{stdout}"
    );
    assert!(
        stdout.contains("--compact-dropout: every run but plain held its dropout masks as bits"),
        "{stdout}"
    );
}

/// `--compact-dropout --budget F`: the planner profiles compact stages, and `F` stays a
/// fraction of the plain run of the table (libtorch's dropout): the bytes it prints equal
/// the budget `--explain` shows for `F` without the flag, and the plan fits them.
#[test]
fn compact_dropout_keeps_a_budget_fraction_of_the_plain_run() {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = SMALL.to_vec();
    args.extend(["--budget", "45%", "--policy", "auto", "--compact-dropout"]);
    let (doc, stdout) = run_ok(&args, &tmp.path().join("budget.json"));
    let bytes_in = |text: &str, prefix: &str| -> u64 {
        text.lines()
            .find_map(|l| l.trim_start().strip_prefix(prefix))
            .and_then(|rest| rest.split_once(" ("))
            .and_then(|(_, rest)| rest.split_once(" B)"))
            .and_then(|(n, _)| n.parse().ok())
            .unwrap_or_else(|| panic!("no `{prefix}` line with bytes in:\n{text}"))
    };
    let bytes = bytes_in(
        &stdout,
        "--compact-dropout: --budget 45% of the plain run's peak is ",
    );
    let mut explain = SMALL.to_vec();
    explain.extend(["--budget", "45%", "--mode", "plain", "--explain"]);
    let (_, explained) = run_ok(&explain, &tmp.path().join("explain.json"));
    assert_eq!(bytes, bytes_in(&explained, "budget: "), "{explained}");
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs[1]["compact_dropout"], true);
    let predicted = runs[1]["plan"]["predicted_peak_bytes"].as_u64().unwrap();
    assert!(predicted <= bytes, "{predicted} > {bytes}");
    assert_eq!(doc["grad_max_abs_diff"].as_f64(), Some(0.0));
}
