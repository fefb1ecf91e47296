//! The book's reference pages generated from the code (`docs/src/reference/cli.md`,
//! `standalone.md`, `crds.md`) are the ones committed. With `SWIMLB_REGENERATE=1` the test
//! rewrites them instead.

use std::path::Path;

use swimlb_e2e::reference::{self, REGENERATE};

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[test]
fn the_committed_reference_pages_are_the_generated_ones() {
    if std::env::var_os("SWIMLB_REGENERATE").is_some() {
        reference::write(root()).expect("the pages are written");
    }
    let stale = reference::stale(root()).expect("the pages are generated");
    assert!(
        stale.is_empty(),
        "{} differ from what the code generates; rewrite them with `{REGENERATE}` \
         (or `SWIMLB_REGENERATE=1 cargo test -p swimlb-e2e --test docs_reference`)",
        stale.join(", ")
    );
}

#[test]
fn every_page_says_it_is_generated_and_by_which_command() {
    for page in reference::pages().expect("the pages are generated") {
        let first = page.text.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("<!--") && first.contains(REGENERATE) && first.ends_with("-->"),
            "{}: {first}",
            page.path
        );
    }
}

#[test]
fn the_cli_page_names_every_flag_of_every_program() {
    let pages = reference::pages().expect("the pages are generated");
    let cli = &pages
        .iter()
        .find(|p| p.path.ends_with("cli.md"))
        .expect("cli.md")
        .text;
    let programs = [
        swimlb_speaker::cli::command(),
        swimlb_controller::cli::command(),
        swimlb_controller::cli::crdgen_command(),
        swimlb_e2e::cli::command(),
    ];
    let mut flags = 0;
    let mut stack: Vec<clap::Command> = programs.to_vec();
    while let Some(command) = stack.pop() {
        for arg in command.get_arguments() {
            if let Some(long) = arg.get_long() {
                assert!(
                    cli.contains(&format!("--{long}`")),
                    "--{long} of {} is missing",
                    command.get_name()
                );
                flags += 1;
            }
        }
        stack.extend(command.get_subcommands().cloned());
    }
    assert!(flags > 50, "only {flags} flags found");
    for status in [
        swimlb_config::cli::EX_USAGE,
        swimlb_config::cli::EX_UNAVAILABLE,
        swimlb_e2e::cli::EXIT_NEEDS_ROOT,
    ] {
        assert!(
            cli.contains(&format!("| {status} |")),
            "exit status {status}"
        );
    }
}

#[test]
fn the_standalone_page_lists_every_key_of_the_parser() {
    let pages = reference::pages().expect("the pages are generated");
    let page = &pages
        .iter()
        .find(|p| p.path.ends_with("standalone.md"))
        .expect("standalone.md")
        .text;
    for key in swimlb_config::standalone::keys::KEYS {
        assert!(
            page.contains(&format!("| `{}` |", key.path)),
            "{} is missing",
            key.path
        );
    }
}
