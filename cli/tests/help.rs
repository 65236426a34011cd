//! The command line itself: help lists every command and the exit codes, completions print, the
//! kubectl plugin names itself as kubectl does, and usage errors exit 2.

mod common;

use std::process::Command;

#[test]
fn help_lists_the_commands_and_the_exit_codes() {
    let out = common::run(&["--help"]).expect_code(0).stdout;
    for word in ["describe", "reset", "pause", "resume", "drain", "import-kcl", "completions", "Exit codes:"] {
        assert!(out.contains(word), "--help lacks {word}:\n{out}");
    }
    for code in ["3  no such", "4  refused", "5  a row changed", "6  malformed", "7  AWS", "8  timed out"] {
        assert!(out.contains(code), "--help lacks exit code {code}:\n{out}");
    }
    let reset = common::run(&["reset", "--help"]).expect_code(0).stdout;
    assert!(reset.contains("--to-earliest") && reset.contains("--export") && reset.contains("Exit codes:"), "{reset}");
    assert!(!reset.contains("pause-before-write"), "the test hook stays hidden");
}

#[test]
fn completions_print_and_the_plugin_names_itself_as_kubectl_does() {
    let bash = common::run(&["completions", "bash"]).expect_code(0).stdout;
    assert!(bash.contains("_leasehold") && bash.contains("import-kcl"), "{}", &bash[..bash.len().min(400)]);
    let plugin = Command::new(env!("CARGO_BIN_EXE_kubectl-leasehold")).arg("--help").output().expect("run plugin");
    let text = String::from_utf8_lossy(&plugin.stdout);
    assert!(text.contains("Usage: kubectl leasehold"), "{text}");
}

#[test]
fn usage_errors_exit_2() {
    common::run(&["describe"]).expect_code(2);
    common::run(&["describe", "ns/name", "--table", "t"]).expect_code(2);
    common::run(&["reset", "--table", "t"]).expect_code(2);
    common::run(&["frobnicate"]).expect_code(2);
}
