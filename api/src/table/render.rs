//! A Table printed as `kubectl get` prints it: upper-case headers, cells
//! aligned by a tabwriter with kubectl's settings (minimum width 6, padding
//! 3), wide columns only with `-o wide`, optional NAMESPACE and LABELS
//! columns read from each row's object metadata.

use serde_json::Value;

use super::printers::{arr_at, format_labels, int_at, str_at};
use crate::meta;

#[derive(Clone, Copy, Debug, Default)]
pub struct RenderOptions {
    /// `-o wide`: also the priority-1 columns.
    pub wide: bool,
    /// A leading NAMESPACE column (`-A`).
    pub namespace_column: bool,
    pub no_headers: bool,
    pub show_labels: bool,
}

/// kubectl's tabwriter settings (`cli-runtime/pkg/printers/tabwriter.go`).
const MIN_WIDTH: usize = 6;
const PADDING: usize = 3;

/// The text kubectl prints for a Table; `""` when it has no rows (the
/// caller then says "No resources found").
pub fn render(table: &Value, options: RenderOptions) -> String {
    let rows = arr_at(table, "/rows");
    if rows.is_empty() {
        return String::new();
    }
    let defs = arr_at(table, "/columnDefinitions");
    let visible: Vec<usize> = (0..defs.len()).filter(|&i| options.wide || int_at(&defs[i], "/priority") == 0).collect();

    let mut lines: Vec<Vec<String>> = Vec::with_capacity(rows.len() + 1);
    if !options.no_headers {
        let mut header = Vec::new();
        if options.namespace_column {
            header.push("NAMESPACE".to_string());
        }
        header.extend(visible.iter().map(|&i| str_at(&defs[i], "/name").to_uppercase()));
        if options.show_labels {
            header.push("LABELS".to_string());
        }
        lines.push(header);
    }
    for row in rows {
        let object = row.get("object").filter(|o| o.is_object());
        let mut line = Vec::new();
        if options.namespace_column {
            line.push(object.and_then(meta::namespace).unwrap_or("").to_string());
        }
        let cells = arr_at(row, "/cells");
        // More cells than columns is bad server output; kubectl ignores them.
        line.extend(visible.iter().filter_map(|&i| cells.get(i)).map(cell_text));
        if options.show_labels {
            if let Some(object) = object {
                line.push(format_labels(object.pointer("/metadata/labels")));
            }
        }
        lines.push(line);
    }
    tabwrite(&lines)
}

/// A cell as kubectl's `fmt.Fprint` shows it; tabs and newlines become
/// spaces so that one cell cannot break the layout.
fn cell_text(cell: &Value) -> String {
    let text = match cell {
        Value::String(s) => s.clone(),
        Value::Null => "<nil>".into(),
        other => other.to_string(),
    };
    text.replace(['\t', '\n', '\r'], " ")
}

/// Go's `text/tabwriter` with kubectl's settings, left-aligned: each line
/// is its cells, all but the last tab-terminated. A column's width is set
/// per block of consecutive lines that have a terminated cell in it.
fn tabwrite(lines: &[Vec<String>]) -> String {
    let mut out = String::new();
    let mut widths = Vec::new();
    format_block(lines, &mut widths, &mut out);
    out
}

fn format_block(lines: &[Vec<String>], widths: &mut Vec<usize>, out: &mut String) {
    let column = widths.len();
    let mut start = 0;
    let mut this = 0;
    while this < lines.len() {
        if column + 1 >= lines[this].len() {
            this += 1;
            continue;
        }
        write_lines(&lines[start..this], widths, out);
        start = this;
        let mut width = MIN_WIDTH;
        while this < lines.len() && column + 1 < lines[this].len() {
            width = width.max(lines[this][column].chars().count() + PADDING);
            this += 1;
        }
        widths.push(width);
        format_block(&lines[start..this], widths, out);
        widths.pop();
        start = this;
    }
    write_lines(&lines[start..], widths, out);
}

fn write_lines(lines: &[Vec<String>], widths: &[usize], out: &mut String) {
    for line in lines {
        for (j, cell) in line.iter().enumerate() {
            out.push_str(cell);
            if let Some(&w) = widths.get(j) {
                if j + 1 < line.len() {
                    out.extend(std::iter::repeat_n(' ', w.saturating_sub(cell.chars().count())));
                }
            }
        }
        out.push('\n');
    }
}
