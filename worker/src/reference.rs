//! Generated reference pages (`docs/reference/*.md`): the flags of a clap command tree, the metrics of
//! a Prometheus registry and a table of exit codes, rendered as Markdown from the code itself. Each
//! crate owning a surface has a `reference_page_*` test that renders its page and compares it with the
//! committed one (`make reference` rewrites them all, through [`check_or_write`]).

use std::fmt::Write as _;
use std::path::Path;

/// Set to anything, [`check_or_write`] writes the page instead of comparing (`make reference`).
pub const WRITE_ENV: &str = "LEASEHOLD_WRITE_REFERENCE";

/// The first line after each page's title: where it comes from and how it is regenerated.
pub fn generated_note(source: &str) -> String {
    format!("Generated from {source} by `make reference`; do not edit by hand (a test fails when it drifts).\n")
}

/// Writes `generated` to `path` when [`WRITE_ENV`] is set; otherwise an error unless the committed page
/// is exactly `generated` (the drift test).
pub fn check_or_write(path: &Path, generated: &str) -> Result<(), String> {
    if std::env::var_os(WRITE_ENV).is_some() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        return std::fs::write(path, generated).map_err(|e| format!("{}: {e}", path.display()));
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if committed == generated {
        Ok(())
    } else {
        Err(format!(
            "{} differs from what the code generates; run `make reference` and commit the result",
            path.display()
        ))
    }
}

/// Escapes text for a Markdown table cell.
fn cell(text: &str) -> String {
    text.trim().replace('\n', " ").replace('|', "\\|")
}

/// The Markdown reference of `command` and, each under a heading of its own, of every subcommand
/// (walked from clap's tree, so a new subcommand appears by itself). `heading` is the level of the top
/// command's heading (2 for `##`).
pub fn command_markdown(command: &clap::Command, heading: usize) -> String {
    let mut out = String::new();
    write_command(&mut out, command, &[], heading);
    out
}

fn write_command(out: &mut String, command: &clap::Command, parents: &[String], heading: usize) {
    let mut path = parents.to_vec();
    path.push(command.get_name().to_string());
    let full = path.join(" ");
    let _ = writeln!(out, "{} `{full}`\n", "#".repeat(heading.min(6)));
    if let Some(about) = command.get_long_about().or(command.get_about()) {
        let _ = writeln!(out, "{}\n", about.to_string().trim());
    }
    let mut usage = vec![full.clone()];
    let positionals: Vec<&clap::Arg> = command.get_positionals().filter(|a| !a.is_hide_set()).collect();
    let options: Vec<&clap::Arg> = command.get_arguments().filter(|a| !a.is_positional() && !a.is_hide_set()).collect();
    if !options.is_empty() {
        usage.push("[OPTIONS]".into());
    }
    for arg in &positionals {
        let name = value_name(arg);
        usage.push(if arg.is_required_set() { format!("<{name}>") } else { format!("[{name}]") });
    }
    let subcommands: Vec<&clap::Command> = command.get_subcommands().filter(|c| !c.is_hide_set()).collect();
    if !subcommands.is_empty() {
        usage.push("<COMMAND>".into());
    }
    let _ = writeln!(out, "Usage: `{}`\n", usage.join(" "));
    if !positionals.is_empty() || !options.is_empty() {
        let _ = writeln!(out, "| argument | environment | default | description |\n|---|---|---|---|");
        for arg in positionals.iter().chain(options.iter()) {
            let _ = writeln!(out, "{}", arg_row(arg, parents.is_empty()));
        }
        out.push('\n');
    }
    if !subcommands.is_empty() {
        let _ = writeln!(out, "| command | what it does |\n|---|---|");
        for sub in &subcommands {
            let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
            let _ = writeln!(out, "| `{full} {}` | {} |", sub.get_name(), cell(&about));
        }
        out.push('\n');
    }
    for sub in subcommands {
        write_command(out, sub, &path, heading + 1);
    }
}

fn value_name(arg: &clap::Arg) -> String {
    arg.get_value_names()
        .and_then(|names| names.first())
        .map(|n| n.to_string())
        .unwrap_or_else(|| arg.get_id().as_str().to_uppercase())
}

/// Whether `arg` takes a value (a flag like `--execute` does not).
fn takes_value(arg: &clap::Arg) -> bool {
    arg.get_action().takes_values()
}

/// A table row for `arg`; `top`: of the top command (where `global` says something: the argument
/// may also follow a subcommand).
fn arg_row(arg: &clap::Arg, top: bool) -> String {
    let mut names = Vec::new();
    if arg.is_positional() {
        names.push(format!("`<{}>`", value_name(arg)));
    } else {
        let value = if takes_value(arg) { format!(" <{}>", value_name(arg)) } else { String::new() };
        if let Some(long) = arg.get_long() {
            names.push(format!("`--{long}{value}`"));
        }
        if let Some(short) = arg.get_short() {
            names.push(format!("`-{short}`"));
        }
    }
    let mut notes = Vec::new();
    if arg.is_required_set() {
        notes.push("required".to_string());
    }
    if top && arg.is_global_set() {
        notes.push("also after a subcommand".to_string());
    }
    if matches!(arg.get_action(), clap::ArgAction::Append) {
        notes.push("repeatable".to_string());
    }
    let values: Vec<String> = if arg.is_hide_possible_values_set() || !takes_value(arg) {
        Vec::new()
    } else {
        arg.get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| match v.get_help() {
                Some(help) => format!("`{}` ({})", v.get_name(), help.to_string().trim().trim_end_matches('.')),
                None => format!("`{}`", v.get_name()),
            })
            .collect()
    };
    if !values.is_empty() {
        notes.push(format!("one of {}", values.join(", ")));
    }
    let help = arg.get_long_help().or(arg.get_help()).map(|h| h.to_string()).unwrap_or_default();
    let description = if notes.is_empty() { help } else { format!("{} ({})", help.trim(), notes.join("; ")) };
    let env = arg.get_env().map(|e| format!("`{}`", e.to_string_lossy())).unwrap_or_default();
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|d| d.to_string_lossy())
        .map(|d| if d.is_empty() { "(empty)".to_string() } else { format!("`{d}`") })
        .collect();
    format!("| {} | {env} | {} | {} |", names.join(", "), defaults.join(", "), cell(&description))
}

/// A table of exit codes: `(code, meaning)` in the order given.
pub fn exit_codes_markdown(codes: &[(u8, &str)]) -> String {
    let mut out = String::from("| code | meaning |\n|---|---|\n");
    for (code, meaning) in codes {
        let _ = writeln!(out, "| {code} | {} |", cell(meaning));
    }
    out
}

/// One metric family read from a text exposition.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MetricFamily {
    /// The name as exported: a counter's with its `_total`, a histogram's without `_bucket`/`_sum`/`_count`.
    pub name: String,
    /// `counter`, `gauge`, `histogram`, ...
    pub kind: String,
    /// The HELP text.
    pub help: String,
    /// The label names of its series (`le` of histograms left out), as found in the exposition.
    pub labels: Vec<String>,
    /// How many sample lines the exposition had for it (0: a labelled family with no series yet).
    pub samples: usize,
}

/// The metric families of a Prometheus/OpenMetrics text exposition, in the order they appear. Label
/// names come from the series present, so the caller creates one series of each labelled family first.
pub fn metric_families(text: &str) -> Vec<MetricFamily> {
    let mut families: Vec<MetricFamily> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.push(MetricFamily { name: name.to_string(), help: help.to_string(), ..MetricFamily::default() });
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            if let Some(family) = families.iter_mut().rev().find(|f| f.name == name) {
                family.kind = kind.to_string();
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let series = line.split_whitespace().next().unwrap_or_default();
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            let Some(family) = families.iter_mut().rev().find(|f| name.starts_with(f.name.as_str())) else {
                continue;
            };
            family.samples += 1;
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                let label = pair.split_once('=').map(|(k, _)| k).unwrap_or(pair).to_string();
                if label != "le" && !family.labels.contains(&label) {
                    family.labels.push(label);
                }
            }
        }
    }
    for family in &mut families {
        if family.kind == "counter" && !family.name.ends_with("_total") {
            family.name.push_str("_total");
        }
    }
    families
}

/// The Markdown table of `families`.
pub fn metrics_markdown(families: &[MetricFamily]) -> String {
    let mut out = String::from("| metric | type | labels | description |\n|---|---|---|---|\n");
    for family in families {
        let labels: Vec<String> = family.labels.iter().map(|l| format!("`{l}`")).collect();
        let _ =
            writeln!(out, "| `{}` | {} | {} | {} |", family.name, family.kind, labels.join(", "), cell(&family.help));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_take_their_names_types_and_labels_from_the_exposition() {
        let text = "# HELP x_records Records.\n# TYPE x_records counter\nx_records_total{policy=\"skip\"} 1\n\
                    # HELP x_duration_seconds Duration.\n# TYPE x_duration_seconds histogram\n\
                    x_duration_seconds_bucket{le=\"0.1\"} 0\nx_duration_seconds_sum 0\n\
                    # HELP x_held Held.\n# TYPE x_held gauge\nx_held{stream=\"a\",shard=\"b\"} 2\n# EOF\n";
        let families = metric_families(text);
        let names: Vec<&str> = families.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["x_records_total", "x_duration_seconds", "x_held"]);
        assert_eq!(families[0].labels, ["policy"]);
        assert!(families[1].labels.is_empty(), "le is not a label of the family");
        assert_eq!(families[2].labels, ["stream", "shard"]);
        assert_eq!(families[1].kind, "histogram");
        assert_eq!(families.iter().map(|f| f.samples).collect::<Vec<_>>(), [1, 2, 1]);
        let page = metrics_markdown(&families);
        assert!(page.contains("| `x_held` | gauge | `stream`, `shard` | Held. |"), "{page}");
    }

    #[test]
    fn a_command_tree_renders_every_subcommand_and_flag() {
        let command = clap::Command::new("tool")
            .about("A tool.")
            .arg(clap::Arg::new("out").long("out").env("TOOL_OUT").default_value("x").help("Where | to"))
            .subcommand(
                clap::Command::new("go")
                    .about("Goes.")
                    .arg(clap::Arg::new("fast").long("fast").action(clap::ArgAction::SetTrue).help("Fast.")),
            );
        let page = command_markdown(&command, 2);
        assert!(page.contains("## `tool`"), "{page}");
        assert!(page.contains("| `--out <OUT>` | `TOOL_OUT` | `x` | Where \\| to |"), "{page}");
        assert!(page.contains("### `tool go`"), "{page}");
        assert!(page.contains("| `--fast` |  |  | Fast. |"), "{page}");
        assert!(page.contains("| `tool go` | Goes. |"), "{page}");
    }

    #[test]
    fn a_stale_page_fails_the_check() {
        let path = std::env::temp_dir().join(format!("leasehold-reference-{}.md", std::process::id()));
        std::fs::write(&path, "old").expect("write");
        if std::env::var_os(WRITE_ENV).is_none() {
            assert!(check_or_write(&path, "new").is_err());
            assert!(check_or_write(&path, "old").is_ok());
        }
        let _ = std::fs::remove_file(&path);
    }
}
