//! The one format of segment names (in errors, `live_segments` and plans), and the short
//! type names generated code puts in them.

use std::ops::Range;
use std::panic::Location;

/// The name of segment `index` (1-based) of `count` of `function` (a method of `owner`),
/// in errors and `live_segments`: `"Encoder::forward_t segment 2 of 3 (src/model.rs:42)"`,
/// or for a function that is one segment (`count = 1`) `"Block::forward (src/model.rs:42)"`.
/// A segment of a chain cut at run time is named by [`chain_segment_name`], in the same
/// format.
pub fn segment_name(
    owner: Option<String>,
    function: &str,
    index: usize,
    count: usize,
    file: &str,
    line: u32,
) -> String {
    format_segment_name(owner, function, index, count, None, file, line)
}

/// [`segment_name`] of a segment of a chain cut at run time (`model!`, `segments = auto`),
/// which also names its `stages`: their range (0-based, end exclusive) and the names of
/// the first and the last:
/// ``"Encoder::forward_t segment 1 of 3: stages 0..3, `tok` to `blocks[0]` (src/m.rs:12)"``.
pub fn chain_segment_name(
    owner: Option<String>,
    function: &str,
    index: usize,
    count: usize,
    stages: (Range<usize>, String, String),
    file: &str,
    line: u32,
) -> String {
    format_segment_name(owner, function, index, count, Some(stages), file, line)
}

/// [`chain_segment_name`] of segment `index` (0-based) of `count` of a chain of modules
/// run by `function` (`checkpoint_sequential`, its binomial and planned twins), the
/// stages named by their index in the caller's slice:
/// ``"checkpoint_sequential segment 2 of 2: stages 2..4, `modules[2]` to `modules[3]` (src/main.rs:9)"``.
pub(crate) fn module_segment_name(
    function: &str,
    index: usize,
    count: usize,
    range: &Range<usize>,
    at: &Location<'_>,
) -> String {
    let stages = (
        range.clone(),
        format!("modules[{}]", range.start),
        format!("modules[{}]", range.end.saturating_sub(1).max(range.start)),
    );
    chain_segment_name(
        None,
        function,
        index + 1,
        count,
        stages,
        at.file(),
        at.line(),
    )
}

/// The one format of segment names.
fn format_segment_name(
    owner: Option<String>,
    function: &str,
    index: usize,
    count: usize,
    stages: Option<(Range<usize>, String, String)>,
    file: &str,
    line: u32,
) -> String {
    let function = match owner {
        Some(owner) => format!("{owner}::{function}"),
        None => function.to_owned(),
    };
    match stages {
        Some((range, first, last)) => format!(
            "{function} segment {index} of {count}: stages {}..{}, `{first}` to `{last}` ({file}:{line})",
            range.start, range.end
        ),
        None if count == 1 => format!("{function} ({file}:{line})"),
        None => format!("{function} segment {index} of {count} ({file}:{line})"),
    }
}

/// `std::any::type_name` without module paths: `Encoder<f32>` for
/// `my_crate::model::Encoder<f32>`.
pub fn short_type_name<T: ?Sized>() -> String {
    let full = std::any::type_name::<T>();
    let mut out = String::with_capacity(full.len());
    let mut segment_start = 0;
    let mut chars = full.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            out.truncate(segment_start);
        } else {
            out.push(c);
            if !(c.is_alphanumeric() || c == '_') {
                segment_start = out.len();
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Tensor;

    struct Local;

    #[test]
    fn short_type_names() {
        assert_eq!(short_type_name::<Local>(), "Local");
        assert_eq!(
            short_type_name::<Vec<Option<Local>>>(),
            "Vec<Option<Local>>"
        );
        assert_eq!(short_type_name::<(i64, Tensor)>(), "(i64, Tensor)");
    }

    #[test]
    fn segment_names() {
        assert_eq!(
            segment_name(
                Some("Encoder".into()),
                "forward_t",
                2,
                3,
                "src/model.rs",
                42
            ),
            "Encoder::forward_t segment 2 of 3 (src/model.rs:42)"
        );
        assert_eq!(
            segment_name(None, "mlp", 1, 2, "a.rs", 1),
            "mlp segment 1 of 2 (a.rs:1)"
        );
        assert_eq!(
            segment_name(Some("Block".into()), "forward", 1, 1, "b.rs", 7),
            "Block::forward (b.rs:7)"
        );
        assert_eq!(
            chain_segment_name(
                Some("Encoder".into()),
                "forward_t",
                1,
                3,
                (0..3, "tok".into(), "blocks[0]".into()),
                "src/m.rs",
                12
            ),
            "Encoder::forward_t segment 1 of 3: stages 0..3, `tok` to `blocks[0]` (src/m.rs:12)"
        );
    }
}
