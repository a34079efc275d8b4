//! The crate's modules in layers: a module uses only modules of lower
//! layers (never one of its own layer, never a higher one), so the modules
//! import each other without a circle and each can be read knowing only what
//! is below it. The test below reads the sources and fails on an import that
//! runs up or sideways; it runs with the rest of `cargo test`.

/// Bottom first. Within a layer, modules do not use each other.
pub(crate) const LAYERS: &[(&str, &[&str])] = &[
    (
        "vocabulary",
        &["boxed", "control", "duration", "error", "hint", "message", "printed", "retry", "shutdown", "throttle"],
    ),
    ("wire", &["envelope", "queue"]),
    ("idempotency stores", &["claims"]),
    ("transports", &["transport"]),
    ("observability", &["observe", "telemetry"]),
    ("what a handler sees", &["context", "publish"]),
    ("extractors", &["enrich", "extract", "health"]),
    ("handlers", &["handler", "schedule"]),
    ("registry", &["registry"]),
    ("pipeline", &["pipeline"]),
    ("worker", &["relay", "scheduler", "worker"]),
    ("app", &["app"]),
    ("console", &["console"]),
    ("tools", &["cli", "testing"]),
    ("generated code and the crate root", &["__private", "lib", "layers"]),
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    use super::LAYERS;

    fn layer_of(module: &str) -> Option<usize> {
        LAYERS.iter().position(|(_, modules)| modules.contains(&module))
    }

    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The code of a file without comments and without its test module.
    fn code(text: &str) -> String {
        let text = match text.find("#[cfg(test)]\nmod tests") {
            Some(at) => &text[..at],
            None => text,
        };
        text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
    }

    /// The top-level modules a file names through `crate::`.
    fn uses(code: &str) -> BTreeSet<String> {
        let mut found = BTreeSet::new();
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let names: Vec<&str> = if let Some(list) = rest.strip_prefix('{') {
                let end = list.find('}').unwrap_or(list.len());
                list[..end].split(',').map(str::trim).collect()
            } else {
                vec![rest]
            };
            for name in names {
                let module: String = name.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if !module.is_empty() && module.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_') {
                    found.insert(module);
                }
            }
        }
        found
    }

    #[test]
    fn modules_use_only_lower_layers() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&src, &mut files);
        let mut problems = Vec::new();
        for file in &files {
            let relative = file.strip_prefix(&src).expect("under src");
            if relative.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let first = relative.iter().next().and_then(|c| c.to_str()).unwrap_or("");
            let module = first.trim_end_matches(".rs");
            let Some(own) = layer_of(module) else {
                problems.push(format!("{}: module `{module}` is in no layer of src/layers.rs", relative.display()));
                continue;
            };
            let text = std::fs::read_to_string(file).expect("read");
            for used in uses(&code(&text)) {
                if used == module {
                    continue;
                }
                match layer_of(&used) {
                    None => problems.push(format!("{}: uses `crate::{used}`, in no layer", relative.display())),
                    Some(layer) if layer >= own => problems.push(format!(
                        "{}: `{module}` (layer {:?}) uses `crate::{used}` (layer {:?}): move what it needs down, \
                         or the user up",
                        relative.display(),
                        LAYERS[own].0,
                        LAYERS[layer].0
                    )),
                    Some(_) => {}
                }
            }
        }
        assert!(problems.is_empty(), "imports that run up or sideways:\n{}", problems.join("\n"));
    }

    #[test]
    fn the_scanner_sees_lists_and_paths() {
        let found = uses("use crate::transport::{self, Transport};\nuse crate::{app::App, error::Error};\nlet x = crate::cli::run();");
        assert_eq!(found.into_iter().collect::<Vec<_>>(), ["app", "cli", "error", "transport"]);
    }
}
