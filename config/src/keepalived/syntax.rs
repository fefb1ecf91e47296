//! keepalived's configuration syntax: words on lines, blocks in `{ }`, `#` and `!` comments,
//! double-quoted strings, and `include` of other files (globs resolved from the directory of the
//! including file, as keepalived does).
//!
//! The result is a tree of [`Statement`]s, each with the file and line it came from. Reading
//! files goes through [`Files`], so the parse itself is pure. What keepalived would read
//! differently from this parse (conditional configuration `@`, parameters `$`, sequences `~`,
//! brace expressions in an include) is refused with its place, never guessed.

use std::path::{Path, PathBuf};

use super::{Finding, Place};

/// How the parser reads the files an `include` names.
pub trait Files {
    /// The text of the file at `path`.
    fn read(&self, path: &Path) -> Result<String, String>;
    /// The names of the entries of the directory `dir`.
    fn list(&self, dir: &Path) -> Result<Vec<String>, String>;
}

/// One word of a line: its text (quotes removed) and whether it was quoted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Word {
    /// The text, without the quotes.
    pub text: String,
    /// Written in double quotes.
    pub quoted: bool,
}

/// A keyword with its words and, when a `{` follows, its block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// The first word.
    pub keyword: String,
    /// The other words of the line.
    pub args: Vec<Word>,
    /// The statements between `{` and `}`.
    pub block: Option<Vec<Statement>>,
    /// Where the keyword is.
    pub at: Place,
}

impl Statement {
    /// The arguments' texts.
    pub fn texts(&self) -> Vec<&str> {
        self.args.iter().map(|w| w.text.as_str()).collect()
    }
}

/// The include keywords (keepalived's variants differ only in which errors they report).
const INCLUDES: [&str; 6] = [
    "include", "includer", "includem", "includew", "includeb", "includea",
];

/// How deep includes may nest (a loop of includes ends here).
const MAX_INCLUDE_DEPTH: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(Word),
    Open,
    Close,
    EndOfLine,
}

/// Splits `text` into tokens with their line numbers; refusals for what cannot be read.
fn tokenize(file: &str, text: &str, refusals: &mut Vec<Finding>) -> Vec<(Token, u32)> {
    let mut tokens = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i as u32 + 1;
        let trimmed = line.trim_start();
        if let Some(first) = trimmed.chars().next()
            && matches!(first, '@' | '$' | '~')
        {
            let what = match first {
                '@' => "conditional configuration (`@`)",
                '$' => "a parameter (`$`)",
                _ => "a sequence (`~SEQ`)",
            };
            refusals.push(Finding::new(
                &Place::new(file, line_no),
                trimmed.split_whitespace().next().unwrap_or(""),
                format!(
                    "{what} is not converted: expand it first (write the lines keepalived uses on this node)"
                ),
            ));
            continue;
        }
        let mut chars = line.chars().peekable();
        let mut current = String::new();
        let flush = |current: &mut String, tokens: &mut Vec<(Token, u32)>| {
            if !current.is_empty() {
                tokens.push((
                    Token::Word(Word {
                        text: std::mem::take(current),
                        quoted: false,
                    }),
                    line_no,
                ));
            }
        };
        while let Some(c) = chars.next() {
            match c {
                '#' | '!' => break,
                '{' | '}' => {
                    flush(&mut current, &mut tokens);
                    tokens.push((if c == '{' { Token::Open } else { Token::Close }, line_no));
                }
                '"' => {
                    flush(&mut current, &mut tokens);
                    let mut text = String::new();
                    let mut closed = false;
                    while let Some(q) = chars.next() {
                        match q {
                            '"' => {
                                closed = true;
                                break;
                            }
                            '\\' if chars.peek() == Some(&'"') => {
                                text.push('"');
                                chars.next();
                            }
                            other => text.push(other),
                        }
                    }
                    if !closed {
                        refusals.push(Finding::new(
                            &Place::new(file, line_no),
                            "\"",
                            "a quoted string is not closed on its line",
                        ));
                    }
                    tokens.push((Token::Word(Word { text, quoted: true }), line_no));
                }
                c if c.is_whitespace() => flush(&mut current, &mut tokens),
                c => current.push(c),
            }
        }
        flush(&mut current, &mut tokens);
        tokens.push((Token::EndOfLine, line_no));
    }
    tokens
}

/// Reads the file `path` (its text `text`) and every file it includes into statements.
/// `path` is `None` for standard input, which may not include files.
pub fn parse(
    path: Option<&Path>,
    text: &str,
    files: &dyn Files,
    refusals: &mut Vec<Finding>,
) -> Vec<Statement> {
    let name = display(path);
    let mut reader = Reader {
        files,
        refusals,
        depth: 0,
    };
    reader.file(path, &name, text)
}

/// The name a file's findings carry: its path, or `(stdin)`.
pub fn display(path: Option<&Path>) -> String {
    path.map_or_else(|| "(stdin)".to_string(), |p| p.display().to_string())
}

struct Reader<'a> {
    files: &'a dyn Files,
    refusals: &'a mut Vec<Finding>,
    depth: usize,
}

impl Reader<'_> {
    fn file(&mut self, path: Option<&Path>, name: &str, text: &str) -> Vec<Statement> {
        let tokens = tokenize(name, text, self.refusals);
        let mut at = 0;
        let statements = self.statements(path, name, &tokens, &mut at, None);
        if let Some((_, line)) = tokens.get(at) {
            self.refusals.push(Finding::new(
                &Place::new(name, *line),
                "}",
                "closes no block",
            ));
        }
        statements
    }

    /// Statements from `tokens[*at..]` until a `}` (left at `*at`) or the end. `opened` is where
    /// the enclosing block's `{` is, for the refusal of a block never closed.
    fn statements(
        &mut self,
        path: Option<&Path>,
        name: &str,
        tokens: &[(Token, u32)],
        at: &mut usize,
        opened: Option<&Place>,
    ) -> Vec<Statement> {
        let mut out: Vec<Statement> = Vec::new();
        loop {
            let Some((token, line)) = tokens.get(*at) else {
                if let Some(open) = opened {
                    self.refusals.push(Finding::new(
                        open,
                        "{",
                        "this block is not closed before the end of the file",
                    ));
                }
                return out;
            };
            match token {
                Token::EndOfLine => *at += 1,
                Token::Close => return out,
                Token::Open => {
                    // A `{` on a line of its own opens the block of the statement before it.
                    let here = Place::new(name, *line);
                    *at += 1;
                    let block = self.block(path, name, tokens, at, &here);
                    match out.last_mut() {
                        Some(last) if last.block.is_none() => last.block = Some(block),
                        _ => self.refusals.push(Finding::new(
                            &here,
                            "{",
                            "opens a block that belongs to no keyword",
                        )),
                    }
                }
                Token::Word(first) => {
                    let place = Place::new(name, *line);
                    *at += 1;
                    let mut args = Vec::new();
                    while let Some((Token::Word(w), _)) = tokens.get(*at) {
                        args.push(w.clone());
                        *at += 1;
                    }
                    let mut block = None;
                    if let Some((Token::Open, _)) = tokens.get(*at) {
                        *at += 1;
                        block = Some(self.block(path, name, tokens, at, &place));
                    }
                    let statement = Statement {
                        keyword: first.text.clone(),
                        args,
                        block,
                        at: place,
                    };
                    if INCLUDES.contains(&statement.keyword.as_str()) {
                        out.extend(self.include(path, &statement));
                    } else {
                        out.push(statement);
                    }
                }
            }
        }
    }

    /// The statements of a block whose `{` was just read, and its `}`.
    fn block(
        &mut self,
        path: Option<&Path>,
        name: &str,
        tokens: &[(Token, u32)],
        at: &mut usize,
        opened: &Place,
    ) -> Vec<Statement> {
        let inner = self.statements(path, name, tokens, at, Some(opened));
        if let Some((Token::Close, _)) = tokens.get(*at) {
            *at += 1;
        }
        inner
    }

    fn include(&mut self, including: Option<&Path>, statement: &Statement) -> Vec<Statement> {
        let refuse = |r: &mut Self, why: String| {
            r.refusals
                .push(Finding::new(&statement.at, &statement.keyword, why));
            Vec::new()
        };
        let Some(including) = including else {
            return refuse(
                self,
                "standard input has no directory to include from: give the file's path".into(),
            );
        };
        if statement.block.is_some() || statement.args.len() != 1 {
            return refuse(
                self,
                "expected one file name or pattern (brace expressions are not converted)".into(),
            );
        }
        if self.depth >= MAX_INCLUDE_DEPTH {
            return refuse(
                self,
                format!("includes nest deeper than {MAX_INCLUDE_DEPTH} files (a loop?)"),
            );
        }
        let pattern = Path::new(&statement.args[0].text);
        let dir = including.parent().unwrap_or(Path::new("."));
        let pattern = if pattern.is_absolute() {
            normalize(pattern)
        } else {
            normalize(&dir.join(pattern))
        };
        let matched = match glob(self.files, &pattern) {
            Ok(m) => m,
            Err(e) => return refuse(self, e),
        };
        let mut out = Vec::new();
        for file in matched {
            match self.files.read(&file) {
                Ok(text) => {
                    self.depth += 1;
                    let name = file.display().to_string();
                    out.extend(self.file(Some(&file), &name, &text));
                    self.depth -= 1;
                }
                Err(e) => {
                    let _: Vec<Statement> = refuse(self, format!("{}: {e}", file.display()));
                }
            }
        }
        out
    }
}

/// `path` with its `.` and `..` components resolved in the text (keepalived reads an include
/// from the directory of the file that names it).
fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push(c);
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// The paths `pattern` names, sorted: the path itself when it has no wildcard (`*`, `?`, `[`),
/// else every match (none is not an error, as for keepalived's `include`).
pub fn glob(files: &dyn Files, pattern: &Path) -> Result<Vec<PathBuf>, String> {
    let text = pattern.to_string_lossy();
    if !text.contains(['*', '?', '[']) {
        return Ok(vec![pattern.to_path_buf()]);
    }
    let mut found = vec![PathBuf::new()];
    for component in pattern.components() {
        let part = component.as_os_str().to_string_lossy();
        if !part.contains(['*', '?', '[']) {
            for f in &mut found {
                f.push(component);
            }
            continue;
        }
        let mut next = Vec::new();
        for dir in &found {
            let Ok(mut names) = files.list(dir) else {
                continue;
            };
            names.sort();
            for entry in names {
                if entry.starts_with('.') && !part.starts_with('.') {
                    continue;
                }
                if matches(&part, &entry) {
                    next.push(dir.join(entry));
                }
            }
        }
        found = next;
    }
    Ok(found)
}

/// Whether `name` matches the shell pattern `pattern` (`*`, `?`, `[abc]`, `[a-z]`, `[!a]`).
fn matches(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    fn go(p: &[char], n: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => (0..=n.len()).any(|i| go(&p[1..], &n[i..])),
            Some('?') => !n.is_empty() && go(&p[1..], &n[1..]),
            Some('[') => {
                let Some(end) = p.iter().skip(1).position(|c| *c == ']').map(|e| e + 1) else {
                    return n.first() == Some(&'[') && go(&p[1..], &n[1..]);
                };
                let Some(c) = n.first() else {
                    return false;
                };
                let mut set = &p[1..end];
                let negate = matches!(set.first(), Some('!') | Some('^'));
                if negate {
                    set = &set[1..];
                }
                let mut hit = false;
                let mut i = 0;
                while i < set.len() {
                    if i + 2 < set.len() && set[i + 1] == '-' {
                        hit |= set[i] <= *c && *c <= set[i + 2];
                        i += 3;
                    } else {
                        hit |= set[i] == *c;
                        i += 1;
                    }
                }
                hit != negate && go(&p[end + 1..], &n[1..])
            }
            Some(c) => n.first() == Some(c) && go(&p[1..], &n[1..]),
        }
    }
    go(&p, &n)
}

#[cfg(test)]
mod tests {
    use super::super::tests::Memory;
    use super::*;

    fn read(text: &str) -> (Vec<Statement>, Vec<Finding>) {
        let mut refusals = Vec::new();
        let tree = parse(
            Some(Path::new("/etc/keepalived/keepalived.conf")),
            text,
            &Memory::default(),
            &mut refusals,
        );
        (tree, refusals)
    }

    #[test]
    fn blocks_words_and_comments_become_a_tree_with_lines() {
        let (tree, refusals) = read(
            "! Configuration File for keepalived\nvrrp_instance VI_1 { # the API\n  interface eth0\n  track_script { chk }\n}\n",
        );
        assert!(refusals.is_empty(), "{refusals:?}");
        assert_eq!(tree.len(), 1);
        let vi = &tree[0];
        assert_eq!(
            (vi.keyword.as_str(), vi.texts()),
            ("vrrp_instance", vec!["VI_1"])
        );
        assert_eq!(vi.at.line, 2);
        let block = vi.block.as_ref().unwrap();
        assert_eq!(block[0].keyword, "interface");
        assert_eq!(block[0].at.line, 3);
        assert_eq!(block[1].block.as_ref().unwrap()[0].keyword, "chk");
    }

    #[test]
    fn a_brace_on_its_own_line_opens_the_block_of_the_line_before() {
        let (tree, refusals) = read("vrrp_script chk\n{\n  script \"/bin/true\"\n}\n");
        assert!(refusals.is_empty(), "{refusals:?}");
        assert_eq!(tree[0].block.as_ref().unwrap()[0].keyword, "script");
    }

    #[test]
    fn quoted_strings_keep_their_spaces_and_comment_characters() {
        let (tree, _) = read("script \"/bin/sh -c 'pidof x # y'\" user\n");
        assert_eq!(tree[0].args[0].text, "/bin/sh -c 'pidof x # y'");
        assert!(tree[0].args[0].quoted);
        assert!(!tree[0].args[1].quoted);
    }

    #[test]
    fn an_unclosed_block_and_a_stray_brace_are_refused_with_their_lines() {
        let (_, refusals) = read("vrrp_instance VI_1 {\n  interface eth0\n");
        assert_eq!(
            refusals[0].to_string(),
            "/etc/keepalived/keepalived.conf:1: {: this block is not closed before the end of the file"
        );
        let (_, refusals) = read("global_defs {\n}\n}\n");
        assert_eq!(refusals[0].line, 3);
        assert_eq!(refusals[0].why, "closes no block");
    }

    #[test]
    fn conditional_lines_and_parameters_are_refused() {
        let (_, refusals) = read("@main router_id a\n$IF=eth0\n");
        assert_eq!(refusals.len(), 2);
        assert_eq!(refusals[0].line, 1);
        assert!(refusals[1].why.contains("parameter"), "{}", refusals[1]);
    }

    #[test]
    fn includes_are_read_relative_to_the_including_file_in_name_order() {
        let mut files = Memory::default();
        files.0.insert(
            "/etc/keepalived/conf.d/b.conf".into(),
            "vrrp_instance B {\n}\n".into(),
        );
        files.0.insert(
            "/etc/keepalived/conf.d/a.conf".into(),
            "include ../scripts.conf\nvrrp_instance A {\n}\n".into(),
        );
        files.0.insert(
            "/etc/keepalived/conf.d/.hidden.conf".into(),
            "vrrp_instance H {\n}\n".into(),
        );
        files.0.insert(
            "/etc/keepalived/scripts.conf".into(),
            "vrrp_script S {\n}\n".into(),
        );
        let mut refusals = Vec::new();
        let tree = parse(
            Some(Path::new("/etc/keepalived/keepalived.conf")),
            "global_defs {\n}\ninclude conf.d/*.conf\n",
            &files,
            &mut refusals,
        );
        assert!(refusals.is_empty(), "{refusals:?}");
        let names: Vec<String> = tree
            .iter()
            .map(|s| format!("{}:{}", s.at.file, s.at.line))
            .collect();
        assert_eq!(
            names,
            [
                "/etc/keepalived/keepalived.conf:1",
                "/etc/keepalived/scripts.conf:1",
                "/etc/keepalived/conf.d/a.conf:2",
                "/etc/keepalived/conf.d/b.conf:1",
            ]
        );
    }

    #[test]
    fn a_missing_include_and_an_include_from_stdin_are_refused() {
        let (_, refusals) = read("include other.conf\n");
        assert_eq!(
            refusals[0].to_string(),
            "/etc/keepalived/keepalived.conf:1: include: /etc/keepalived/other.conf: No such file or directory"
        );
        let mut refusals = Vec::new();
        parse(None, "include x\n", &Memory::default(), &mut refusals);
        assert!(
            refusals[0].why.starts_with("standard input"),
            "{refusals:?}"
        );
    }

    #[test]
    fn an_include_loop_ends_with_a_refusal() {
        let mut files = Memory::default();
        files
            .0
            .insert("/k/a.conf".into(), "include a.conf\n".into());
        let mut refusals = Vec::new();
        parse(
            Some(Path::new("/k/a.conf")),
            "include a.conf\n",
            &files,
            &mut refusals,
        );
        assert_eq!(refusals.len(), 1, "{refusals:?}");
        assert!(refusals[0].why.contains("nest deeper"), "{refusals:?}");
    }

    #[test]
    fn shell_patterns_match_as_glob_does() {
        assert!(matches("*.conf", "a.conf"));
        assert!(!matches("*.conf", "a.confx"));
        assert!(matches("vi_[0-9].conf", "vi_7.conf"));
        assert!(!matches("vi_[!0-9].conf", "vi_7.conf"));
        assert!(matches("?.c*", "a.conf"));
    }
}
