//! Unit tests of the main program's data modules (`examples/train_classifier/`): the
//! ListOps generator (determinism from the seed, evaluation of hand-written expressions,
//! the generator's limits), the text corpus loader (tokenizer, vocabulary, errors on
//! bad folders) and the padded data sets. The modules are compiled here as they are in the example, and their own
//! `#[cfg(test)]` tests run; examples are not test targets by default.

#[allow(dead_code)]
#[path = "../examples/train_classifier/listops.rs"]
mod listops;

#[allow(dead_code)]
#[path = "../examples/train_classifier/text.rs"]
mod text;

#[allow(dead_code)]
#[path = "../examples/train_classifier/data.rs"]
mod data;
