//! Attribute parsing shared by the macros: `key = value`, bare flags,
//! `key(nested = ..)` lists and one leading positional string. Every problem
//! is collected and reported at the offending token.

use proc_macro2::{Span, TokenStream};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Path, Token};

/// Collects errors so that all of them are reported together (serde's `Ctxt`).
#[derive(Default)]
pub(crate) struct Errors {
    errors: Vec<syn::Error>,
}

impl Errors {
    pub(crate) fn push(&mut self, span: Span, message: impl std::fmt::Display) {
        self.errors.push(syn::Error::new(span, message));
    }

    pub(crate) fn push_error(&mut self, error: syn::Error) {
        self.errors.push(error);
    }

    /// All errors combined, or `Ok` when there are none.
    pub(crate) fn finish(self) -> syn::Result<()> {
        let mut iter = self.errors.into_iter();
        match iter.next() {
            None => Ok(()),
            Some(mut first) => {
                for e in iter {
                    first.combine(e);
                }
                Err(first)
            }
        }
    }
}

/// One `key`, `key = value` or `key(...)` of an attribute.
pub(crate) struct Arg {
    pub(crate) key: Ident,
    pub(crate) value: Value,
}

pub(crate) enum Value {
    Flag,
    Expr(Expr),
    List(Vec<Arg>),
}

/// The parsed arguments of an attribute.
pub(crate) struct Args {
    pub(crate) positional: Option<LitStr>,
    pub(crate) args: Vec<Arg>,
}

impl Parse for Arg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let key: Ident = input.call(syn::ext::IdentExt::parse_any)?;
        let value = if input.peek(Token![=]) {
            input.parse::<Token![=]>()?;
            Value::Expr(input.parse()?)
        } else if input.peek(syn::token::Paren) {
            let content;
            syn::parenthesized!(content in input);
            let nested = Punctuated::<Arg, Token![,]>::parse_terminated(&content)?;
            Value::List(nested.into_iter().collect())
        } else {
            Value::Flag
        };
        Ok(Arg { key, value })
    }
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let positional = if input.peek(LitStr) {
            let lit: LitStr = input.parse()?;
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
            Some(lit)
        } else {
            None
        };
        let args = Punctuated::<Arg, Token![,]>::parse_terminated(input)?;
        Ok(Args { positional, args: args.into_iter().collect() })
    }
}

/// Reads the keys of one attribute against the options it knows.
pub(crate) struct Reader<'a> {
    macro_name: &'static str,
    known: &'static [&'static str],
    seen: Vec<String>,
    pub(crate) errors: &'a mut Errors,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(macro_name: &'static str, known: &'static [&'static str], errors: &'a mut Errors) -> Self {
        Reader { macro_name, known, seen: Vec::new(), errors }
    }

    /// Checks a key: known, and not repeated. Returns whether to use it.
    pub(crate) fn accept(&mut self, key: &Ident) -> bool {
        let name = key.to_string();
        if !self.known.contains(&name.as_str()) {
            let hint = closest(&name, self.known).map(|k| format!("; did you mean `{k}`?")).unwrap_or_default();
            self.errors.push(
                key.span(),
                format!(
                    "unknown option `{name}` for `#[messaging::{}]`{hint} (known options: {})",
                    self.macro_name,
                    self.known.join(", ")
                ),
            );
            return false;
        }
        if self.seen.contains(&name) {
            self.errors.push(key.span(), format!("`{name}` set more than once; keep one"));
            return false;
        }
        self.seen.push(name);
        true
    }

    pub(crate) fn flag(&mut self, arg: &Arg) -> bool {
        match &arg.value {
            Value::Flag => true,
            _ => {
                self.errors.push(arg.key.span(), format!("`{}` is a flag: write it alone, without a value", arg.key));
                false
            }
        }
    }

    pub(crate) fn string(&mut self, arg: &Arg) -> Option<LitStr> {
        match &arg.value {
            Value::Expr(Expr::Lit(ExprLit { lit: Lit::Str(s), .. })) => Some(s.clone()),
            Value::Expr(e) => {
                self.errors.push(span_of(e), format!("`{}` takes a string, e.g. `{} = \"...\"`", arg.key, arg.key));
                None
            }
            _ => {
                self.errors.push(arg.key.span(), format!("`{}` takes a string, e.g. `{} = \"...\"`", arg.key, arg.key));
                None
            }
        }
    }

    pub(crate) fn int(&mut self, arg: &Arg) -> Option<(u64, Span)> {
        match &arg.value {
            Value::Expr(Expr::Lit(ExprLit { lit: Lit::Int(i), .. })) => match i.base10_parse::<u64>() {
                Ok(v) => Some((v, i.span())),
                Err(e) => {
                    self.errors.push_error(e);
                    None
                }
            },
            Value::Expr(e) => {
                self.errors.push(span_of(e), format!("`{}` takes an integer, e.g. `{} = 1`", arg.key, arg.key));
                None
            }
            _ => {
                self.errors.push(arg.key.span(), format!("`{}` takes an integer, e.g. `{} = 1`", arg.key, arg.key));
                None
            }
        }
    }

    pub(crate) fn path(&mut self, arg: &Arg, example: &str) -> Option<Path> {
        match &arg.value {
            Value::Expr(Expr::Path(p)) if p.qself.is_none() => Some(p.path.clone()),
            Value::Expr(e) => {
                self.errors
                    .push(span_of(e), format!("`{}` takes a type name, e.g. `{} = {example}`", arg.key, arg.key));
                None
            }
            _ => {
                self.errors
                    .push(arg.key.span(), format!("`{}` takes a type name, e.g. `{} = {example}`", arg.key, arg.key));
                None
            }
        }
    }

    pub(crate) fn ident(&mut self, arg: &Arg) -> Option<Ident> {
        match &arg.value {
            Value::Expr(Expr::Path(p)) if p.qself.is_none() && p.path.get_ident().is_some() => {
                p.path.get_ident().cloned()
            }
            _ => {
                self.errors.push(
                    arg.key.span(),
                    format!("`{}` takes a field name, e.g. `{} = customer_id`", arg.key, arg.key),
                );
                None
            }
        }
    }

    pub(crate) fn duration(&mut self, arg: &Arg) -> Option<(u64, Span)> {
        let lit = self.string(arg)?;
        match parse_duration_ms(&lit.value()) {
            Ok(ms) => Some((ms, lit.span())),
            Err(e) => {
                self.errors.push(lit.span(), e);
                None
            }
        }
    }

    pub(crate) fn list<'b>(&mut self, arg: &'b Arg) -> Option<&'b [Arg]> {
        match &arg.value {
            Value::List(items) => Some(items),
            _ => {
                self.errors.push(
                    arg.key.span(),
                    format!("`{}` takes a list, e.g. `{}(base = \"1s\", max = \"5m\")`", arg.key, arg.key),
                );
                None
            }
        }
    }
}

fn span_of(e: &Expr) -> Span {
    syn::spanned::Spanned::span(e)
}

/// Parses `500ms`, `30s`, `5m`, `1h` into milliseconds, with the runtime's
/// own parser (one syntax for macros, command line and URLs).
pub(crate) fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let d = crate::duration::parse_duration(text)?;
    u64::try_from(d.as_millis()).map_err(|_| format!("`{text}` is too long a duration"))
}

/// Names people reach for, and the option they mean (when the macro has it).
const ALIASES: &[(&str, &str)] = &[
    ("version", "v"),
    ("ver", "v"),
    ("dead_letter", "dlq"),
    ("dead_letter_queue", "dlq"),
    ("deadletter", "dlq"),
    ("group_id", "group"),
    ("group_id", "default_group"),
    ("group", "default_group"),
    ("message_group", "group"),
    ("dedup_id", "id"),
    ("message_id", "id"),
    ("identity", "id"),
    ("upcast_to", "upcast"),
    ("max_concurrency", "concurrency"),
    ("parallelism", "concurrency"),
    ("visibility_timeout", "visibility"),
    ("max_receive_count", "max_receives"),
    ("idempotency", "idempotent"),
    ("idempotency_scope", "idempotent"),
    ("scope", "idempotent"),
    ("backoff", "retry"),
    ("timezone", "tz"),
    ("time_zone", "tz"),
    ("zone", "tz"),
    ("catchup", "catch_up"),
    ("missed", "catch_up"),
    ("interval", "every"),
    ("period", "every"),
    ("delay", "jitter"),
];

/// The known option closest to a misspelt one, if any is close.
fn closest(name: &str, known: &[&'static str]) -> Option<&'static str> {
    let alias = ALIASES
        .iter()
        .filter(|(alias, _)| *alias == name)
        .find_map(|(_, meant)| known.iter().find(|k| *k == meant).copied());
    if alias.is_some() {
        return alias;
    }
    known
        .iter()
        .map(|k| (crate::hint::edit_distance(name, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// The item unchanged plus the error, so that the rest of the user's code
/// still type-checks (tokio-macros' `token_stream_with_error`).
pub(crate) fn with_error(item: TokenStream, error: syn::Error) -> TokenStream {
    let mut out = item;
    out.extend(error.into_compile_error());
    out
}

/// Whether a type mentions `impl Trait`, which cannot be named in a path.
pub(crate) fn mentions_impl(ty: &syn::Type) -> bool {
    fn walk(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|t| match t {
            proc_macro2::TokenTree::Ident(i) => i == "impl",
            proc_macro2::TokenTree::Group(g) => walk(g.stream()),
            _ => false,
        })
    }
    walk(quote::quote!(#ty))
}
