//! The book's reference pages, generated from the code so they cannot drift from it: every flag
//! of every program from the clap definitions ([`cli`]), every key of the standalone file from
//! the parser's table of keys ([`standalone`]), every field of every custom resource from the
//! CRD schemas ([`crds`]).
//!
//! Pure: [`pages`] returns the text; `swimlb-docgen` writes it, and `e2e/tests/docs_reference.rs`
//! fails while a committed page differs.

use std::path::Path;

pub mod cli;
pub mod crds;
pub mod standalone;

/// The command that rewrites the pages, as the pages and the test name it.
pub const REGENERATE: &str = "cargo run -q -p swimlb-e2e --bin swimlb-docgen";

/// One generated page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// Its path from the repository's root.
    pub path: &'static str,
    /// Its whole text.
    pub text: String,
}

/// Every generated page.
pub fn pages() -> anyhow::Result<Vec<Page>> {
    Ok(vec![
        Page {
            path: "docs/src/reference/cli.md",
            text: cli::page()?,
        },
        Page {
            path: "docs/src/reference/standalone.md",
            text: standalone::page()?,
        },
        Page {
            path: "docs/src/reference/crds.md",
            text: crds::page()?,
        },
    ])
}

/// The pages under `root` (the repository) that differ from [`pages`].
pub fn stale(root: &Path) -> anyhow::Result<Vec<&'static str>> {
    Ok(pages()?
        .into_iter()
        .filter(|page| {
            std::fs::read_to_string(root.join(page.path)).ok() != Some(page.text.clone())
        })
        .map(|page| page.path)
        .collect())
}

/// Writes every page under `root`; returns the paths whose text changed.
pub fn write(root: &Path) -> anyhow::Result<Vec<&'static str>> {
    let mut changed = Vec::new();
    for page in pages()? {
        let path = root.join(page.path);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(page.text.as_str()) {
            std::fs::write(&path, &page.text)
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
            changed.push(page.path);
        }
    }
    Ok(changed)
}

/// The first line of every generated page.
fn generated_comment() -> String {
    format!("<!-- Generated from the code by `{REGENERATE}`: do not edit by hand. -->\n")
}

/// `text` as one table cell: on one line, `|` escaped, empty as `-`.
fn cell(text: &str) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.is_empty() {
        "-".to_string()
    } else {
        one_line.replace('|', "\\|")
    }
}

/// `text` as inline code (longer backtick fences when it holds backticks).
fn code(text: &str) -> String {
    if text.contains('`') {
        format!("`` {text} ``")
    } else {
        format!("`{text}`")
    }
}

/// A markdown table with `header` and `rows`, each cell passed through [`cell`].
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::new();
    out.push_str(&format!("| {} |\n", header.join(" | ")));
    out.push_str(&format!(
        "|{}\n",
        header.iter().map(|_| " --- |").collect::<String>()
    ));
    for row in rows {
        let cells: Vec<String> = row.iter().map(|c| cell(c)).collect();
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_one_line_with_its_pipes_escaped() {
        assert_eq!(cell("a | b\n  c"), "a \\| b c");
        assert_eq!(cell("  "), "-");
    }

    #[test]
    fn a_table_has_a_separator_row_of_its_width() {
        let t = table(&["A", "B"], &[vec!["1".into(), "x|y".into()]]);
        assert_eq!(t, "| A | B |\n| --- | --- |\n| 1 | x\\|y |\n");
    }
}
