//! Output for people (aligned columns, colour only on a terminal) and for scripts (JSON, YAML).

use std::io::IsTerminal;

use clap::ValueEnum;
use serde::Serialize;

use crate::shared::error::{CliError, Result};

/// How results are printed.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Aligned columns for people.
    #[default]
    Table,
    /// JSON, for scripts.
    Json,
    /// YAML, for scripts.
    Yaml,
}

/// Prints `value` as JSON or YAML; false when the format is `table` (the caller prints its own).
pub fn structured<T: Serialize>(format: Format, value: &T) -> Result<bool> {
    let text = match format {
        Format::Table => return Ok(false),
        Format::Json => serde_json::to_string_pretty(value).map_err(|e| CliError::Service(e.to_string()))? + "\n",
        Format::Yaml => serde_yaml_ng::to_string(value).map_err(|e| CliError::Service(e.to_string()))?,
    };
    print!("{text}");
    Ok(true)
}

/// True when stdout is a terminal and `NO_COLOR` is unset.
pub fn colour() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// `text` in bold, or as is when not on a terminal.
pub fn bold(text: &str, on: bool) -> String {
    if on { format!("\x1b[1m{text}\x1b[0m") } else { text.to_string() }
}

/// Rows as aligned columns (two spaces apart), like `kubectl get`; the last column is not padded.
pub fn columns(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(width) = widths.get_mut(i) {
                *width = (*width).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            out.push_str(cell);
            if i < last {
                out.push_str(&" ".repeat(widths[i] - cell.chars().count() + 2));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_on_the_widest_cell() {
        let out = columns(&["A", "BB"], &[vec!["long".into(), "x".into()], vec!["s".into(), "y".into()]]);
        assert_eq!(out, "A     BB\nlong  x\ns     y\n");
    }
}
