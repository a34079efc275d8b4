//! `#[messaging::queue]`: parse the options, check them, generate `impl Queue`
//! and the registration.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{Ident, ItemStruct, LitStr};

use crate::attr::{with_error, Args, Errors, Reader};

const KNOWN: &[&str] =
    &["name", "fifo", "dlq", "default_group", "concurrency", "visibility", "max_receives", "idempotent"];

/// The checked options of one queue.
struct QueueArgs {
    name: LitStr,
    fifo: bool,
    dlq: Option<LitStr>,
    default_group: Option<LitStr>,
    concurrency: u64,
    visibility_ms: u64,
    max_receives: u64,
    idempotent: bool,
}

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let strukt = match syn::parse2::<ItemStruct>(item.clone()) {
        Ok(strukt) => strukt,
        Err(_) => {
            let error = syn::Error::new(
                Span::call_site(),
                "`#[messaging::queue]` goes on a unit struct, e.g. `pub struct Orders;`",
            );
            return with_error(item, error);
        }
    };
    let args = match syn::parse2::<Args>(args) {
        Ok(args) => args,
        Err(e) => return with_error(item, e),
    };
    let mut errors = Errors::default();
    let checked = parse(args, &strukt, &mut errors);
    // Even when an option is wrong, the queue is still declared (with the
    // options that could be read), so that the code using it reports nothing
    // more than the option itself.
    let mut out = if strukt.generics.params.is_empty() { generate(&strukt, &checked) } else { item };
    if let Err(e) = errors.finish() {
        out.extend(e.into_compile_error());
    }
    out
}

fn parse(args: Args, strukt: &ItemStruct, errors: &mut Errors) -> QueueArgs {
    if !matches!(strukt.fields, syn::Fields::Unit) || !strukt.generics.params.is_empty() {
        errors.push(
            strukt.ident.span(),
            format!("a queue is a unit struct without generics: `pub struct {};`", strukt.ident),
        );
    }
    let mut name = args.positional;
    let (mut fifo, mut dlq, mut default_group) = (None, None, None);
    let mut idempotent = false;
    let (mut concurrency, mut visibility_ms, mut max_receives) = (1, 30_000, 5);
    {
        let mut reader = Reader::new("queue", KNOWN, errors);
        for arg in &args.args {
            if !reader.accept(&arg.key) {
                continue;
            }
            match arg.key.to_string().as_str() {
                "idempotent" => idempotent = reader.flag(arg),
                "name" => {
                    if name.is_some() {
                        reader.errors.push(
                            arg.key.span(),
                            "the name is given twice (positionally and as `name = ..`); keep one",
                        );
                    }
                    name = reader.string(arg).or(name);
                }
                "fifo" => fifo = reader.flag(arg).then_some(arg.key.span()),
                "dlq" => dlq = reader.string(arg),
                "default_group" => default_group = reader.string(arg),
                "concurrency" => match reader.int(arg) {
                    Some((0, span)) => reader
                        .errors
                        .push(span, "`concurrency` must be at least 1 (1 = one message at a time, in order)"),
                    Some((n, _)) => concurrency = n,
                    None => {}
                },
                "visibility" => match reader.duration(arg) {
                    Some((ms, span)) if !(1_000..=12 * 3_600_000).contains(&ms) => {
                        reader.errors.push(span, "`visibility` must be between 1s and 12h (the Amazon SQS limits)")
                    }
                    Some((ms, _)) => visibility_ms = ms,
                    None => {}
                },
                "max_receives" => match reader.int(arg) {
                    Some((n, span)) if n == 0 || n > 1000 => {
                        reader.errors.push(span, "`max_receives` must be between 1 and 1000")
                    }
                    Some((n, _)) => max_receives = n,
                    None => {}
                },
                _ => {}
            }
        }
    }
    let is_fifo = fifo.is_some();
    let name = match name {
        Some(name) => {
            check_name(&name, is_fifo, "queue", errors);
            name
        }
        None => {
            let suggestion = format!("{}{}", to_kebab(&strukt.ident), if is_fifo { ".fifo" } else { "" });
            errors.push(
                Span::call_site(),
                format!("missing queue name: write `#[messaging::queue(\"{suggestion}\", ..)]`"),
            );
            // Declared anyway under the suggested name, so that only this error shows.
            LitStr::new(&suggestion, Span::call_site())
        }
    };
    if let Some(dlq) = &dlq {
        let value = dlq.value();
        match (is_fifo, value.ends_with(".fifo")) {
            (true, false) => errors.push(
                dlq.span(),
                format!("the dead-letter queue of a FIFO queue must be FIFO too: write `dlq = \"{value}.fifo\"`"),
            ),
            (false, true) => errors.push(
                dlq.span(),
                format!(
                    "`{}` is a standard queue, so its dead-letter queue must be standard too: write \
                     `dlq = \"{}\"`, or make the queue FIFO",
                    name.value(),
                    value.trim_end_matches(".fifo")
                ),
            ),
            _ => check_name(dlq, is_fifo, "dead-letter queue", errors),
        }
        if value == name.value() {
            errors.push(dlq.span(), "a queue cannot be its own dead-letter queue");
        }
    }
    if let Some(group) = &default_group {
        if !is_fifo {
            errors.push(
                group.span(),
                "`default_group` applies only to FIFO queues (a standard queue has no message \
                 groups): remove it, or add `fifo` to the queue",
            );
        } else if group.value().is_empty() || group.value().len() > 128 {
            errors.push(group.span(), "`default_group` must be 1 to 128 characters long");
        }
    }
    QueueArgs {
        name,
        fifo: is_fifo,
        dlq,
        default_group: default_group.filter(|_| is_fifo),
        concurrency,
        visibility_ms,
        max_receives,
        idempotent,
    }
}

/// Name rules of Amazon SQS, which the other transports share.
fn check_name(lit: &LitStr, fifo: bool, what: &str, errors: &mut Errors) {
    let name = lit.value();
    if name.is_empty() || name.len() > 80 {
        errors.push(
            lit.span(),
            format!(
                "{what} name `{name}` is {} characters long; names have 1 to 80 characters (the \
                 Amazon SQS limit, `.fifo` included): shorten it",
                name.len()
            ),
        );
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))) {
        errors.push(
            lit.span(),
            format!("{what} name `{name}` contains `{c}`; use only letters, digits, `-`, `_` and `.`"),
        );
    }
    if what == "queue" {
        match (fifo, name.ends_with(".fifo")) {
            (true, false) => errors.push(
                lit.span(),
                format!("a FIFO queue's name must end with `.fifo`: write `\"{name}.fifo\"`, or remove `fifo` for a standard queue"),
            ),
            (false, true) => errors.push(
                lit.span(),
                format!("`{name}` ends with `.fifo` but the queue is not declared FIFO: add `fifo`, or drop the suffix"),
            ),
            _ => {}
        }
    }
}

fn to_kebab(ident: &Ident) -> String {
    let mut out = String::new();
    for (i, c) in ident.to_string().chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('-');
        }
        out.extend(c.to_lowercase());
    }
    out
}

fn generate(strukt: &ItemStruct, q: &QueueArgs) -> TokenStream {
    let ident = &strukt.ident;
    let name = &q.name;
    let fifo = q.fifo;
    let kind = if fifo { quote!(::messaging::__private::Fifo) } else { quote!(::messaging::__private::Standard) };
    let has_default = if q.default_group.is_some() {
        quote!(::messaging::__private::Yes)
    } else {
        quote!(::messaging::__private::No)
    };
    let opt = |v: &Option<LitStr>| match v {
        Some(s) => quote!(::core::option::Option::Some(#s)),
        None => quote!(::core::option::Option::None),
    };
    let dlq = opt(&q.dlq);
    let default_group = opt(&q.default_group);
    let concurrency = q.concurrency as usize;
    let visibility = q.visibility_ms;
    let max_receives = q.max_receives as u32;
    let idempotent = q.idempotent;
    quote! {
        #strukt

        impl ::messaging::__private::Queue for #ident {
            type Kind = #kind;
            type HasDefaultGroup = #has_default;
            const SPEC: ::messaging::__private::QueueSpec = ::messaging::__private::QueueSpec {
                name: #name,
                fifo: #fifo,
                dlq: #dlq,
                default_group: #default_group,
                concurrency: #concurrency,
                visibility: ::messaging::__private::Duration::from_millis(#visibility),
                max_receives: #max_receives,
                idempotent: #idempotent,
            };
        }

        const _: () = {
            fn spec() -> ::messaging::__private::QueueSpec {
                <#ident as ::messaging::__private::Queue>::SPEC
            }
            ::messaging::__private::inventory::submit! {
                ::messaging::__private::QueueEntry {
                    type_name: ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#ident)),
                    spec,
                }
            }
        };
    }
}
