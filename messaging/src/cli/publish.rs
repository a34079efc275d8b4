//! `publish QUEUE --type NAME --data JSON`: one message from the command line,
//! its data read as the registered type (so a typo is an error, not a poison
//! message) and sent in the versioned envelope, under the rules of a typed send.

use std::io::Read as _;
use std::time::Duration;

use crate::app::App;
use crate::error::Error;
use crate::publish::EncodedSend;
use crate::registry::MessageEntry;

/// The arguments of `publish`.
#[derive(Debug, clap::Args)]
pub(super) struct PublishArgs {
    /// The queue's name.
    queue: String,
    /// The message's logical name (`#[message(name = ..)]`), or the Rust type's
    /// name for a type without one.
    #[arg(long = "type", value_name = "NAME")]
    type_name: String,
    /// The message's data as JSON, or `-` to read it from standard input.
    #[arg(long, value_name = "JSON")]
    data: String,
    /// The version to write (default: the newest); an older one is upcast by
    /// the consumer.
    #[arg(long = "version", value_name = "N")]
    message_version: Option<u32>,
    /// The FIFO message group (default: the message's group field, else the
    /// queue's default group).
    #[arg(long)]
    group: Option<String>,
    /// The message's identity, over its `id = field` (deduplication id on
    /// FIFO queues).
    #[arg(long)]
    id: Option<String>,
    /// Delay delivery (standard queues), e.g. 30s.
    #[arg(long, value_parser = crate::duration::parse_duration)]
    delay: Option<Duration>,
    /// A message attribute KEY=VALUE (repeatable).
    #[arg(long = "attribute", value_name = "KEY=VALUE", value_parser = parse_attribute)]
    attributes: Vec<(String, String)>,
    /// Print the published message as one JSON object (queue, message id,
    /// type, version) instead of a sentence.
    #[arg(long)]
    json: bool,
}

fn parse_attribute(text: &str) -> Result<(String, String), String> {
    text.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).ok_or_else(|| format!("`{text}` is not KEY=VALUE"))
}

/// Publishes one message; prints its id.
pub(super) async fn run(app: &mut App, args: PublishArgs) -> Result<(), Error> {
    super::declared(app, &args.queue)?;
    let spec = app
        .registry()
        .queues()
        .iter()
        .find(|q| q.name == args.queue)
        .cloned()
        .ok_or_else(|| Error::Command(format!("`{}` is not a declared queue", args.queue)))?;
    let entry = message_entry(&args.type_name, args.message_version)?;
    let data = if args.data == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| Error::Command(format!("could not read the data from standard input: {e}")))?;
        text
    } else {
        args.data
    };
    let encoded = (entry.encode)(data.as_bytes()).map_err(|e| {
        Error::Command(format!("the data is not a valid `{}` ({}): {e}", describe(entry), entry.type_name))
    })?;
    for field in &encoded.ignored {
        eprintln!("warning: `{field}` is not a field of {}; it was left out", describe(entry));
    }
    let send = EncodedSend {
        group: args.group,
        identity: args.id,
        delay: args.delay,
        attributes: args.attributes.into_iter().collect(),
        ..EncodedSend::default()
    };
    let id = app.setup().publisher().send_encoded(&spec, encoded, send).await?;
    if args.json {
        let value = serde_json::json!({
            "queue": spec.name,
            "message_id": id.as_str(),
            "type": entry.name.unwrap_or(entry.type_name),
            "version": entry.name.map(|_| entry.version),
        });
        out!("{value}");
    } else {
        out!("published {} to `{}` as {id}", describe(entry), spec.name);
    }
    Ok(())
}

/// `orders.placed v2`, or the type path of a bare-body type.
fn describe(entry: &MessageEntry) -> String {
    match entry.name {
        Some(name) => format!("{name} v{}", entry.version),
        None => entry.type_name.to_owned(),
    }
}

/// The registered message called `name` (logical name, or the Rust type's
/// path or last segment), at `version` or its newest.
fn message_entry(name: &str, version: Option<u32>) -> Result<&'static MessageEntry, Error> {
    let all: Vec<&'static MessageEntry> = inventory::iter::<MessageEntry>.into_iter().collect();
    let by_name: Vec<&'static MessageEntry> = all.iter().copied().filter(|m| m.name == Some(name)).collect();
    let candidates = if by_name.is_empty() {
        all.iter()
            .copied()
            .filter(|m| m.name.is_none() && (m.type_name == name || m.type_name.rsplit("::").next() == Some(name)))
            .collect()
    } else {
        by_name
    };
    if candidates.is_empty() {
        let mut known: Vec<String> = all.iter().map(|m| m.name.unwrap_or(m.type_name).to_owned()).collect();
        known.sort();
        known.dedup();
        return Err(Error::Command(format!("no message type `{name}`; known: {}", known.join(", "))));
    }
    // Bare types share no logical name: two of them matching is ambiguous.
    if candidates.iter().all(|m| m.name.is_none()) && candidates.len() > 1 {
        let paths: Vec<&str> = candidates.iter().map(|m| m.type_name).collect();
        return Err(Error::Command(format!("`{name}` names several types; write its path: {}", paths.join(", "))));
    }
    match version {
        Some(v) => candidates.iter().copied().find(|m| m.version == v).ok_or_else(|| {
            let mut versions: Vec<u32> = candidates.iter().map(|m| m.version).collect();
            versions.sort_unstable();
            let versions: Vec<String> = versions.iter().map(u32::to_string).collect();
            Error::Command(format!("`{name}` has no version {v}; it has {}", versions.join(", ")))
        }),
        None => candidates
            .iter()
            .copied()
            .max_by_key(|m| m.version)
            .ok_or_else(|| Error::Command(format!("no message type `{name}`"))),
    }
}
