//! Folder-per-class text corpora in the IMDB `aclImdb` layout: tokenizer, vocabulary,
//! loader.
//!
//! Layout: `DIR/train/<class>/*.txt` and `DIR/test/<class>/*.txt`, one document a file
//! (Maas et al. 2011, "Learning Word Vectors for Sentiment Analysis": `aclImdb/` with
//! classes `neg` and `pos`). The classes are the sub-folders of `DIR/train` that also
//! exist in `DIR/test`, sorted by name (label = index). A training folder without a test
//! counterpart (`aclImdb/train/unsup`, the unlabelled reviews) is skipped; a test folder
//! without a training counterpart is an error. Files not ending in `.txt` are ignored;
//! bytes that are not UTF-8 are replaced (U+FFFD).
//!
//! Tokenizer ([`tokenize`]): HTML line breaks (`<br />`, `<br/>`, `<br>`) become
//! spaces, the text is lowercased, and it is split on every character that is not
//! alphanumeric (Unicode `char::is_alphanumeric`), dropping empty pieces: `"Don't
//! stop!<br />10/10"` gives `don t stop 10 10`.
//!
//! Vocabulary ([`Vocab::build`]): `<pad>` (id 0), `<unk>` (id 1), then the training
//! split's words that occur at least `min_freq` times, most frequent first (ties by
//! word), `max_size` entries in all. Documents are cut to `seq_len` tokens, and an empty
//! document becomes one `<unk>`.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};

/// Id of the unknown-word token.
pub const UNK: i64 = 1;

/// Splits `text` into lowercase alphanumeric words (see the [module docs](self)).
pub fn tokenize(text: &str) -> Vec<String> {
    let text = text
        .replace("<br />", " ")
        .replace("<br/>", " ")
        .replace("<br>", " ")
        .to_lowercase();
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Settings of [`Vocab::build`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VocabConfig {
    /// Words rarer than this in the training split map to `<unk>`.
    pub min_freq: usize,
    /// Most entries, `<pad>` and `<unk>` included (at least 2).
    pub max_size: usize,
}

/// Word ↔ id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocab {
    words: Vec<String>,
    ids: HashMap<String, i64>,
}

impl Vocab {
    /// The vocabulary of `docs` (see the [module docs](self)).
    pub fn build<'a>(docs: impl IntoIterator<Item = &'a [String]>, cfg: &VocabConfig) -> Self {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for doc in docs {
            for w in doc {
                *counts.entry(w.as_str()).or_default() += 1;
            }
        }
        let mut ranked: Vec<(&str, usize)> = counts
            .into_iter()
            .filter(|&(_, n)| n >= cfg.min_freq.max(1))
            .collect();
        ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        ranked.truncate(cfg.max_size.saturating_sub(2));
        let words: Vec<String> = ["<pad>", "<unk>"]
            .into_iter()
            .chain(ranked.into_iter().map(|(w, _)| w))
            .map(str::to_owned)
            .collect();
        let ids = words
            .iter()
            .enumerate()
            .map(|(i, w)| (w.clone(), i as i64))
            .collect();
        Vocab { words, ids }
    }

    /// Number of entries (`<pad>` and `<unk>` included).
    pub fn len(&self) -> usize {
        self.words.len()
    }

    /// Whether the vocabulary has no entry (never, once built: `<pad>` and `<unk>`).
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// The id of `word` (`UNK` when absent).
    pub fn id(&self, word: &str) -> i64 {
        self.ids.get(word).copied().unwrap_or(UNK)
    }

    /// Ids of the first `seq_len` tokens; `[UNK]` for an empty document.
    pub fn encode(&self, tokens: &[String], seq_len: usize) -> Vec<i64> {
        let ids: Vec<i64> = tokens.iter().take(seq_len).map(|w| self.id(w)).collect();
        if ids.is_empty() { vec![UNK] } else { ids }
    }
}

/// One tokenized document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// Its words.
    pub tokens: Vec<String>,
    /// Index into [`Corpus::classes`].
    pub label: usize,
}

/// A loaded corpus.
#[derive(Debug, Clone)]
pub struct Corpus {
    /// Class names, sorted.
    pub classes: Vec<String>,
    /// Training documents, by class then file name.
    pub train: Vec<Document>,
    /// Test documents, likewise.
    pub test: Vec<Document>,
    /// Training folders skipped because `test/` has no such class (`unsup` in aclImdb).
    pub skipped: Vec<String>,
}

/// Sub-folder names of `dir`, sorted.
fn subdirs(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("{}: cannot read", dir.display()))? {
        let entry = entry.with_context(|| format!("{}: cannot read", dir.display()))?;
        if entry.path().is_dir() {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// The `.txt` files of `dir`, sorted.
fn txt_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("{}: cannot read", dir.display()))? {
        let path = entry
            .with_context(|| format!("{}: cannot read", dir.display()))?
            .path();
        if path.is_file() && path.extension().is_some_and(|e| e == "txt") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn load_split(split_dir: &Path, classes: &[String]) -> Result<Vec<Document>> {
    let mut docs = Vec::new();
    for (label, class) in classes.iter().enumerate() {
        let dir = split_dir.join(class);
        let files = txt_files(&dir)?;
        ensure!(
            !files.is_empty(),
            "{}: no .txt files (each class folder needs at least one document)",
            dir.display()
        );
        for file in files {
            let bytes =
                fs::read(&file).with_context(|| format!("{}: cannot read", file.display()))?;
            docs.push(Document {
                tokens: tokenize(&String::from_utf8_lossy(&bytes)),
                label,
            });
        }
    }
    Ok(docs)
}

/// Loads `dir` (see the [module docs](self) for the layout and the tokenizer).
///
/// # Errors
///
/// Naming the path: `dir`, `dir/train` or `dir/test` missing or not a folder; fewer than
/// two classes in both splits; a test class that training lacks; a class folder without
/// `.txt` files; an unreadable file.
pub fn load_corpus(dir: &Path) -> Result<Corpus> {
    ensure!(
        dir.is_dir(),
        "--data {}: not a folder (expected the aclImdb layout: DIR/train/<class>/*.txt and \
         DIR/test/<class>/*.txt)",
        dir.display()
    );
    let (train_dir, test_dir) = (dir.join("train"), dir.join("test"));
    for split in [&train_dir, &test_dir] {
        ensure!(
            split.is_dir(),
            "{}: missing (expected one folder per class inside, holding .txt files)",
            split.display()
        );
    }
    let train_classes = subdirs(&train_dir)?;
    let test_classes = subdirs(&test_dir)?;
    if let Some(extra) = test_classes.iter().find(|c| !train_classes.contains(c)) {
        bail!(
            "{}: class `{extra}` has no training folder {}",
            test_dir.join(extra).display(),
            train_dir.join(extra).display()
        );
    }
    let skipped = train_classes
        .iter()
        .filter(|c| !test_classes.contains(c))
        .cloned()
        .collect();
    let classes = test_classes;
    ensure!(
        classes.len() >= 2,
        "{}: found {} class folder(s) present in both train/ and test/ ({:?}); a classifier needs \
         at least 2",
        dir.display(),
        classes.len(),
        classes
    );
    let train = load_split(&train_dir, &classes)?;
    let test = load_split(&test_dir, &classes)?;
    Ok(Corpus {
        classes,
        train,
        test,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    #[test]
    fn tokenizer_is_as_documented() {
        assert_eq!(
            tokenize("Don't stop!<br />10/10 — GREAT<br/>film<br>ok"),
            ["don", "t", "stop", "10", "10", "great", "film", "ok"]
        );
        assert_eq!(tokenize("  ...  "), Vec::<String>::new());
        assert_eq!(tokenize("Ünïcode Straße"), ["ünïcode", "straße"]);
    }

    #[test]
    fn vocabulary_orders_by_frequency_and_respects_limits() {
        let docs: Vec<Vec<String>> = ["b a a c", "a b d"].iter().map(|t| tokenize(t)).collect();
        let all = Vocab::build(
            docs.iter().map(Vec::as_slice),
            &VocabConfig {
                min_freq: 1,
                max_size: 100,
            },
        );
        assert_eq!(all.words, ["<pad>", "<unk>", "a", "b", "c", "d"]);
        let frequent = Vocab::build(
            docs.iter().map(Vec::as_slice),
            &VocabConfig {
                min_freq: 2,
                max_size: 100,
            },
        );
        assert_eq!(frequent.len(), 4);
        assert_eq!(frequent.id("c"), UNK);
        let small = Vocab::build(
            docs.iter().map(Vec::as_slice),
            &VocabConfig {
                min_freq: 1,
                max_size: 3,
            },
        );
        assert_eq!(small.words, ["<pad>", "<unk>", "a"]);
        assert_eq!(small.encode(&tokenize("a b a"), 2), [2, UNK]);
        assert_eq!(small.encode(&[], 8), [UNK]);
    }

    #[test]
    fn loads_the_aclimdb_layout() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write(&d.join("train/pos/0_9.txt"), "Great film<br />great");
        write(&d.join("train/pos/1_8.txt"), "loved it");
        write(&d.join("train/neg/0_2.txt"), "Boring.");
        write(&d.join("train/neg/notes.md"), "ignored");
        write(&d.join("train/unsup/0_0.txt"), "no label");
        write(&d.join("test/pos/0_10.txt"), "great");
        write(&d.join("test/neg/0_1.txt"), "awful");
        let c = load_corpus(d).unwrap();
        assert_eq!(c.classes, ["neg", "pos"]);
        assert_eq!(
            c.skipped,
            ["unsup"],
            "the unlabelled folder is skipped, and said so"
        );
        assert_eq!(c.train.len(), 3);
        assert_eq!(c.train[0].tokens, ["boring"]);
        assert_eq!(c.train[0].label, 0);
        assert_eq!(c.train[1].tokens, ["great", "film", "great"]);
        assert_eq!(c.test.len(), 2);
    }

    fn error_of(dir: &Path) -> String {
        format!("{:#}", load_corpus(dir).unwrap_err())
    }

    #[test]
    fn bad_folders_are_clear_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();

        let missing = d.join("nope");
        let e = error_of(&missing);
        assert!(e.contains("not a folder") && e.contains("nope"), "{e}");

        let e = error_of(d);
        assert!(e.contains("train: missing"), "{e}");

        fs::create_dir_all(d.join("train")).unwrap();
        let e = error_of(d);
        assert!(e.contains("test: missing"), "{e}");

        fs::create_dir_all(d.join("test")).unwrap();
        let e = error_of(d);
        assert!(e.contains("found 0 class folder(s)"), "{e}");

        write(&d.join("train/pos/a.txt"), "good");
        write(&d.join("test/pos/a.txt"), "good");
        let e = error_of(d);
        assert!(e.contains("at least 2"), "{e}");

        write(&d.join("test/neg/a.txt"), "bad");
        let e = error_of(d);
        assert!(e.contains("class `neg` has no training folder"), "{e}");

        fs::create_dir_all(d.join("train/neg")).unwrap();
        let e = error_of(d);
        assert!(
            e.contains(&format!("{}: no .txt files", d.join("train/neg").display())),
            "{e}"
        );

        write(&d.join("train/neg/a.txt"), "bad");
        assert!(load_corpus(d).is_ok());
    }
}
