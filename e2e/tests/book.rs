//! The book (`docs/`, mdBook) and the README, checked as a reader meets them:
//!
//! - every page under `docs/src` is in `SUMMARY.md` (no page a reader cannot reach), and every
//!   page the summary names exists;
//! - `mdbook build` succeeds, and every relative link of every built page leads to a page or file
//!   of the built book, anchors included (the ids mdBook itself wrote, so a heading renamed
//!   breaks the links to it);
//! - the README's relative links lead to files of the repository, and its links into the book
//!   to anchors the built book has;
//! - the README is at most 300 lines, and the user's pages (the README and every page outside
//!   `docs/src/development/`) name no commit and no issue number: those belong to the history.
//!
//! `mdbook` is found in `$SWIMLB_MDBOOK`, else on the `PATH`; `test.sh` installs the pinned
//! version. Without it the build test fails and says so.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn book_src() -> PathBuf {
    repo().join("docs/src")
}

/// The markdown files under `dir`, relative to it, with `/` separators.
fn markdown_files(dir: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).expect("read docs/src") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                let rel = path.strip_prefix(root).expect("under root");
                out.insert(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

/// The text outside fenced code blocks and inline code spans, line by line, so that an example
/// in a code block is neither a link nor a commit.
fn prose(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut fence: Option<&str> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        match fence {
            Some(f) => {
                if trimmed.starts_with(f) {
                    fence = None;
                }
                lines.push(String::new());
            }
            None if trimmed.starts_with("```") || trimmed.starts_with("~~~") => {
                fence = Some(&trimmed[..3]);
                lines.push(String::new());
            }
            None => {
                let mut out = String::new();
                let mut in_code = false;
                for c in line.chars() {
                    if c == '`' {
                        in_code = !in_code;
                    } else if !in_code {
                        out.push(c);
                    }
                }
                lines.push(out);
            }
        }
    }
    lines
}

/// The targets of the inline links `[text](target)` of markdown prose.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose(text) {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.to_string());
            rest = &after[end..];
        }
    }
    targets
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

/// `a/b/../c` to `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_page_is_in_the_summary_and_every_summary_entry_exists() {
    let src = book_src();
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).expect("docs/src/SUMMARY.md");
    let listed: BTreeSet<String> = link_targets(&summary)
        .into_iter()
        .map(|t| normalize(Path::new(&t)).to_string_lossy().into_owned())
        .collect();
    let mut files = markdown_files(&src);
    files.remove("SUMMARY.md");
    let orphans: Vec<_> = files.difference(&listed).collect();
    let missing: Vec<_> = listed.difference(&files).collect();
    assert!(
        orphans.is_empty(),
        "pages no reader can reach (add them to docs/src/SUMMARY.md or delete them): {orphans:?}"
    );
    assert!(
        missing.is_empty(),
        "docs/src/SUMMARY.md names pages that do not exist: {missing:?}"
    );
}

/// `hex` looks like an abbreviated or full commit id: 7-40 hex digits with a letter and a digit.
fn looks_like_commit(word: &str) -> bool {
    (7..=40).contains(&word.len())
        && word
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        && word.chars().any(|c| c.is_ascii_digit())
        && word.chars().any(|c| c.is_ascii_alphabetic())
}

/// What of the history a user page names: commit ids, and issue numbers (`issue 27`, `#27`).
fn history_on(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in prose(text).iter().enumerate() {
        let words: Vec<&str> = line
            .split(|c: char| !c.is_ascii_alphanumeric() && c != '#')
            .filter(|w| !w.is_empty())
            .collect();
        for (i, w) in words.iter().enumerate() {
            let numbered = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
            if looks_like_commit(w) {
                found.push(format!("line {}: commit-like `{w}`", n + 1));
            } else if w.strip_prefix('#').is_some_and(numbered) {
                found.push(format!("line {}: `{w}`", n + 1));
            } else if w.eq_ignore_ascii_case("issue")
                && words.get(i + 1).is_some_and(|next| numbered(next))
            {
                found.push(format!("line {}: `issue {}`", n + 1, words[i + 1]));
            }
        }
    }
    found
}

#[test]
fn user_pages_name_no_commit_and_no_issue_number() {
    let src = book_src();
    let mut pages: Vec<(String, PathBuf)> = markdown_files(&src)
        .into_iter()
        .filter(|p| !p.starts_with("development/"))
        .map(|p| (format!("docs/src/{p}"), src.join(p)))
        .collect();
    pages.push(("README.md".into(), repo().join("README.md")));
    let mut problems = Vec::new();
    for (name, path) in pages {
        let text = std::fs::read_to_string(&path).expect("page");
        for found in history_on(&text) {
            problems.push(format!("{name}: {found}"));
        }
    }
    assert!(
        problems.is_empty(),
        "user pages name the project's history (it belongs in docs/src/development/ or \
         CHANGELOG.md):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_history_check_finds_commits_and_issue_numbers_but_not_code() {
    let text = "fixed in 56d6cb7, see issue 27 and #48\n`1dc622a` in code\n\
                ```\ncommit fcf27a0\n```\nsha256 of 0.5 s; a 1000ms deadline, v1.37.2\n";
    let found = history_on(text);
    assert_eq!(
        found,
        vec![
            "line 1: commit-like `56d6cb7`",
            "line 1: `issue 27`",
            "line 1: `#48`"
        ],
        "{found:?}"
    );
}

#[test]
fn the_readme_is_the_front_door_at_most_300_lines() {
    let text = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let lines = text.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines: references, measurements and their history belong in the book"
    );
}

fn mdbook() -> PathBuf {
    if let Some(p) = std::env::var_os("SWIMLB_MDBOOK") {
        return PathBuf::from(p);
    }
    PathBuf::from("mdbook")
}

/// Builds the book into a fresh folder of its own for `test` (tests run in parallel) and returns
/// it.
fn build_book(test: &str) -> PathBuf {
    let out =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("book-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(mdbook())
        .arg("build")
        .arg(repo().join("docs"))
        .arg("--dest-dir")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}): install mdBook (test.sh does) or set SWIMLB_MDBOOK",
                mdbook().display()
            )
        });
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "mdbook build failed:\n{stderr}");
    // mdBook reports a broken summary or a failing preprocessor as an error but may go on.
    assert!(
        !stderr.contains("ERROR"),
        "mdbook build reported errors:\n{stderr}"
    );
    out
}

/// The values of `attr="..."` in an HTML text.
fn attribute_values<'t>(html: &'t str, attr: &str) -> Vec<&'t str> {
    let needle = format!(" {attr}=\"");
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find(&needle) {
        let after = &rest[at + needle.len()..];
        let end = after.find('"').unwrap_or(after.len());
        out.push(&after[..end]);
        rest = &after[end..];
    }
    out
}

/// The html files of the built book (relative path -> its ids).
fn built_pages(out: &Path) -> BTreeMap<String, BTreeSet<String>> {
    fn walk(root: &Path, dir: &Path, pages: &mut BTreeMap<String, BTreeSet<String>>) {
        for entry in std::fs::read_dir(dir).expect("read book") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(root, &path, pages);
            } else if path.extension().is_some_and(|e| e == "html") {
                let html = std::fs::read_to_string(&path).expect("html");
                let ids = attribute_values(&html, "id")
                    .into_iter()
                    .map(str::to_string)
                    .collect();
                let rel = path.strip_prefix(root).expect("under root");
                pages.insert(rel.to_string_lossy().replace('\\', "/"), ids);
            }
        }
    }
    let mut pages = BTreeMap::new();
    walk(out, out, &mut pages);
    pages
}

/// Whether `target` (a relative link, maybe with `#anchor`) from the built page `from` leads to
/// a file of the built book and, with an anchor, to an id on that page.
fn resolve(
    out: &Path,
    pages: &BTreeMap<String, BTreeSet<String>>,
    from: &str,
    target: &str,
) -> Result<(), String> {
    let (file, anchor) = match target.split_once('#') {
        Some((f, a)) => (f, Some(a)),
        None => (target, None),
    };
    let page = if file.is_empty() {
        from.to_string()
    } else {
        let base = Path::new(from).parent().unwrap_or(Path::new(""));
        let joined = normalize(&base.join(file));
        let mut rel = joined.to_string_lossy().replace('\\', "/");
        if rel.starts_with("..") || rel.is_empty() {
            return Err("leads outside the book".into());
        }
        if out.join(&rel).is_dir() {
            rel = format!("{}/index.html", rel.trim_end_matches('/'));
        }
        if !out.join(&rel).is_file() {
            return Err(format!("no file {rel} in the built book"));
        }
        rel
    };
    match (anchor, pages.get(&page)) {
        (Some(a), Some(ids)) if !a.is_empty() && !ids.contains(a) => {
            Err(format!("{page} has no anchor #{a}"))
        }
        _ => Ok(()),
    }
}

#[test]
fn the_book_builds_and_every_link_in_it_resolves() {
    let out = build_book("links");
    let pages = built_pages(&out);
    assert!(
        pages.contains_key("index.html") && pages.len() > 20,
        "the built book has {} pages",
        pages.len()
    );
    let mut broken = Vec::new();
    for page in pages.keys() {
        // print.html repeats every page with its links rewritten to anchors of its own.
        if page == "print.html" || page == "404.html" || page == "toc.html" {
            continue;
        }
        let html = std::fs::read_to_string(out.join(page)).expect("html");
        for href in attribute_values(&html, "href") {
            if is_external(href) || href.starts_with("javascript:") {
                continue;
            }
            if let Err(why) = resolve(&out, &pages, page, href) {
                broken.push(format!("{page}: {href}: {why}"));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    assert!(
        broken.is_empty(),
        "broken links in the book (the markdown source is docs/src/<page>.md):\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_readmes_links_lead_to_files_of_the_repository_and_anchors_of_the_book() {
    let out = build_book("readme");
    let pages = built_pages(&out);
    let text = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let mut broken = Vec::new();
    for target in link_targets(&text) {
        if is_external(&target) || target.starts_with('#') {
            continue;
        }
        let (file, anchor) = match target.split_once('#') {
            Some((f, a)) => (f, Some(a)),
            None => (target.as_str(), None),
        };
        if !repo().join(file).exists() {
            broken.push(format!("{target}: no such file"));
            continue;
        }
        if let (Some(a), Some(page)) = (anchor, file.strip_prefix("docs/src/")) {
            let html = page
                .replace(".md", ".html")
                .replace("README.html", "index.html");
            if !pages.get(&html).is_some_and(|ids| ids.contains(a)) {
                broken.push(format!(
                    "{target}: the built page {html} has no anchor #{a}"
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    assert!(
        broken.is_empty(),
        "broken links in README.md:\n{}",
        broken.join("\n")
    );
}

/// The `### ` headings of a page, without their marks.
fn headings(text: &str) -> Vec<String> {
    prose(text)
        .iter()
        .filter_map(|l| l.strip_prefix("### "))
        .map(|h| h.trim().to_string())
        .collect()
}

#[test]
fn troubleshooting_explains_every_event_reason_and_every_status_verdict() {
    use swimlb_config::events::Reason;
    use swimlb_speaker::model::election::VerdictKind;
    let page = std::fs::read_to_string(book_src().join("troubleshooting.md"))
        .expect("docs/src/troubleshooting.md");
    let headings = headings(&page);
    let explained = |word: &str| {
        headings
            .iter()
            .any(|h| h == word || h.starts_with(&format!("{word} ")))
    };
    let missing: Vec<&str> = Reason::ALL
        .iter()
        .map(|r| r.as_str())
        .chain(VerdictKind::ALL.iter().map(|v| v.as_str()))
        .filter(|word| !explained(word))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/src/troubleshooting.md has no `### <name>` heading for these Event reasons or \
         status verdicts: {missing:?}"
    );
}
