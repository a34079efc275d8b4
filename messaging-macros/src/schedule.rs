//! `#[messaging::schedule]`: parse the cadence and options, check them with
//! the runtime's own cadence code (`schedule/cadence.rs`), check the
//! signature, then generate the build function and its registration.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, LitStr, Path, ReturnType, Type};

use crate::attr::{mentions_impl, with_error, Args, Errors, Reader};
use crate::cadence::{parse_cron, parse_zone, Cadence, REFERENCE_MS};

const KNOWN: &[&str] = &["queue", "every", "name", "tz", "catch_up", "group", "jitter"];

/// When the schedule ticks.
enum When {
    Cron { expression: LitStr, zone: Option<LitStr> },
    Every { ms: u64 },
}

struct ScheduleArgs {
    queue: Path,
    when: When,
    name: Option<LitStr>,
    catch_up: &'static str,
    group: Option<LitStr>,
    jitter_ms: u64,
}

/// The checked signature: the argument types and the declared return type.
struct Signature {
    arguments: Vec<Type>,
    output: Type,
}

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let result = syn::parse2::<ItemFn>(item.clone())
        .map_err(|_| {
            syn::Error::new(
                Span::call_site(),
                "`#[messaging::schedule]` goes on a function that returns the message to publish",
            )
        })
        .and_then(|func| {
            let mut errors = Errors::default();
            let args = syn::parse2::<Args>(args).map_err(|e| errors.push_error(e));
            let checked = args.ok().and_then(|a| parse_args(a, &mut errors));
            let signature = parse_signature(&func, &mut errors);
            errors.finish()?;
            match (checked, signature) {
                (Some(a), Some(s)) => Ok(generate(&func, &a, &s)),
                _ => Err(syn::Error::new(Span::call_site(), "invalid schedule")),
            }
        });
    match result {
        Ok(tokens) => tokens,
        Err(e) => with_error(item, e),
    }
}

fn parse_args(args: Args, errors: &mut Errors) -> Option<ScheduleArgs> {
    let mut queue = None;
    let (mut every, mut every_span) = (None, None);
    let (mut name, mut zone, mut group) = (None, None, None);
    let mut catch_up = "Skip";
    let (mut jitter_ms, mut jitter_span) = (0, None);
    let mut keyed_cron = false;
    let mut reader = Reader::new("schedule", KNOWN, errors);
    for arg in &args.args {
        if arg.key == "cron" {
            keyed_cron = true;
            reader.errors.push(
                arg.key.span(),
                "write the cron expression first, without a key: `#[messaging::schedule(\"0 */5 * * * *\", queue = ..)]`",
            );
            continue;
        }
        if !reader.accept(&arg.key) {
            continue;
        }
        match arg.key.to_string().as_str() {
            "queue" => queue = reader.path(arg, "Reports"),
            "every" => {
                every_span = Some(arg.key.span());
                every = reader.duration(arg);
            }
            "name" => match reader.string(arg) {
                Some(s) if s.value().trim().is_empty() => {
                    reader.errors.push(s.span(), "the schedule's name is empty; write one, e.g. `name = \"nightly-report\"`")
                }
                other => name = other,
            },
            "tz" => zone = reader.string(arg),
            "group" => match reader.string(arg) {
                Some(s) if !valid_id(&s.value()) => reader.errors.push(
                    s.span(),
                    "a message group id is 1 to 128 printable ASCII characters without spaces, e.g. `group = \"reports\"`",
                ),
                other => group = other,
            },
            "catch_up" => {
                if let Some(s) = reader.string(arg) {
                    match s.value().as_str() {
                        "skip" => catch_up = "Skip",
                        "last" => catch_up = "Last",
                        "all" => catch_up = "All",
                        other => reader.errors.push(
                            s.span(),
                            format!(
                                "unknown catch-up policy \"{other}\": \"skip\" (missed ticks are skipped, the default), \
                                 \"last\" (the newest missed tick is published) or \"all\" (every missed tick, up to 100)"
                            ),
                        ),
                    }
                }
            }
            "jitter" => {
                if let Some((ms, span)) = reader.duration(arg) {
                    jitter_ms = ms;
                    jitter_span = Some(span);
                }
            }
            _ => {}
        }
    }
    let when = match (&args.positional, every) {
        (Some(expression), None) => {
            if every_span.is_some() {
                None
            } else {
                check_cron(expression, zone.as_ref(), errors)
                    .map(|()| When::Cron { expression: expression.clone(), zone: zone.clone() })
            }
        }
        (Some(expression), Some(_)) => {
            errors.push(expression.span(), "a schedule ticks by a cron expression or by `every`, not both: remove one");
            None
        }
        (None, Some((ms, span))) => {
            if let Some(zone) = &zone {
                errors.push(
                    zone.span(),
                    "`tz` is the zone a cron expression's wall clock is read in; an interval (`every`) is elapsed \
                     time and has none: remove `tz`",
                );
            }
            match Cadence::every(ms) {
                Ok(_) => Some(When::Every { ms }),
                Err(e) => {
                    errors.push(span, e);
                    None
                }
            }
        }
        (None, None) if every_span.is_some() || keyed_cron => None, // its error is reported
        (None, None) => {
            errors.push(
                Span::call_site(),
                "a schedule needs a cron expression or an interval: `#[messaging::schedule(\"0 */5 * * * *\", queue = \
                 Reports)]` or `#[messaging::schedule(every = \"5m\", queue = Reports)]`",
            );
            None
        }
    };
    if let (Some(when), Some(span)) = (&when, jitter_span) {
        if let Some(gap) = shortest_gap(when) {
            if jitter_ms >= gap {
                errors.push(
                    span,
                    format!(
                        "a jitter of {} is not shorter than the {} between ticks: a tick would be published after \
                         the next one; make it shorter",
                        crate::duration::format_duration(jitter_ms),
                        crate::duration::format_duration(gap)
                    ),
                );
            }
        }
    }
    let Some(queue) = queue else {
        errors.push(
            Span::call_site(),
            "missing `queue = ...`: name the queue the schedule publishes to, e.g. \
             `#[messaging::schedule(\"0 * * * *\", queue = Reports)]`",
        );
        return None;
    };
    Some(ScheduleArgs { queue, when: when?, name, catch_up, group, jitter_ms })
}

/// Checks a cron expression and its zone, each at its own token.
fn check_cron(expression: &LitStr, zone: Option<&LitStr>, errors: &mut Errors) -> Option<()> {
    let mut ok = true;
    if let Err(e) = parse_cron(&expression.value()) {
        errors.push(expression.span(), e);
        ok = false;
    }
    if let Some(zone) = zone {
        if let Err(e) = parse_zone(&zone.value()) {
            errors.push(zone.span(), e);
            ok = false;
        }
    }
    if !ok {
        return None;
    }
    match Cadence::cron(&expression.value(), zone.map(LitStr::value).as_deref()) {
        Ok(_) => Some(()),
        Err(e) => {
            errors.push(expression.span(), e);
            None
        }
    }
}

/// The shortest time between two ticks: the interval, or the least gap
/// among a cron expression's first ticks of 2026.
fn shortest_gap(when: &When) -> Option<u64> {
    match when {
        When::Every { ms } => Some(*ms),
        When::Cron { expression, zone } => {
            let cadence = Cadence::cron(&expression.value(), zone.as_ref().map(LitStr::value).as_deref()).ok()?;
            let ticks = cadence.upcoming(REFERENCE_MS, 200);
            ticks.windows(2).map(|w| u64::try_from(w[1] - w[0]).unwrap_or(0)).min()
        }
    }
}

/// A valid message group id: 1 to 128 printable ASCII characters.
fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.chars().all(|c| c.is_ascii_graphic())
}

fn parse_signature(func: &ItemFn, errors: &mut Errors) -> Option<Signature> {
    let sig = &func.sig;
    if !sig.generics.params.is_empty() {
        errors.push(sig.generics.params.span(), "a schedule function cannot be generic");
    }
    let mut arguments = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(r) => {
                errors.push(r.span(), "a schedule function is a free function, not a method: remove `self`")
            }
            FnArg::Typed(pat) => arguments.push((*pat.ty).clone()),
        }
    }
    match &sig.output {
        ReturnType::Default => {
            errors.push(
                sig.paren_token.span.join(),
                format!(
                    "a schedule function returns the message to publish: write `fn {}(..) -> YourMessage` \
                     (or `Option<YourMessage>`, or a `Result` of either)",
                    sig.ident
                ),
            );
            None
        }
        ReturnType::Type(_, ty) if mentions_impl(ty) => {
            errors.push(ty.span(), "name the message type the schedule returns: `impl Trait` cannot be published");
            None
        }
        ReturnType::Type(_, ty) => Some(Signature { arguments, output: (**ty).clone() }),
    }
}

fn generate(func: &ItemFn, args: &ScheduleArgs, sig: &Signature) -> TokenStream {
    let fn_name = &func.sig.ident;
    let queue = &args.queue;
    let output = &sig.output;
    let arg_names: Vec<_> = (0..sig.arguments.len()).map(|i| format_ident!("__arg{}", i)).collect();
    let extract = sig.arguments.iter().zip(&arg_names).map(|(ty, name)| {
        quote_spanned! {ty.span()=>
            let #name = <#ty as ::messaging::__private::FromTick>::from_tick(&tick, &resources)?;
        }
    });
    let requirements = sig.arguments.iter().map(|ty| {
        quote_spanned! {ty.span()=> <#ty as ::messaging::__private::FromTick>::requirement() }
    });
    let call = if func.sig.asyncness.is_some() {
        quote! { #fn_name(#(#arg_names),*).await }
    } else {
        quote! { #fn_name(#(#arg_names),*) }
    };
    let output_type = quote_spanned! {output.span()=> type Output = #output; };
    let grouped = if args.group.is_some() { quote!(Grouped) } else { quote!(Ungrouped) };
    let message = quote! { <S::Output as ::messaging::__private::ScheduleOutput>::Message };
    // The FIFO rules of a send, at the user's `queue = ..` token.
    let fifo_bound = quote_spanned! {queue.span()=>
        (
            <#queue as ::messaging::__private::Queue>::Kind,
            ::messaging::__private::#grouped,
            <#queue as ::messaging::__private::Queue>::HasDefaultGroup,
            <#message as ::messaging::__private::Message>::HasGroup,
        ): ::messaging::__private::ScheduleGroupResolved<#queue, #message>
    };
    // Checked where the message type is named (a wrong one is reported
    // there, once more); the bound itself points at `queue = ..`.
    let fifo_check = quote_spanned! {output.span()=> const _: fn() = __messaging_fifo_rules::<__MessagingThis>; };
    let queue_spec = quote_spanned! {queue.span()=> <#queue as ::messaging::__private::Queue>::SPEC };
    let path = quote! { ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#fn_name)) };
    let name = match &args.name {
        Some(name) => quote!(#name),
        None => path.clone(),
    };
    let none = quote!(::core::option::Option::None);
    let (cron, zone, every) = match &args.when {
        When::Cron { expression, zone } => {
            let zone = match zone {
                Some(z) => quote!(::core::option::Option::Some(#z)),
                None => none.clone(),
            };
            (quote!(::core::option::Option::Some(#expression)), zone, none.clone())
        }
        When::Every { ms } => (none.clone(), none.clone(), quote!(::core::option::Option::Some(#ms))),
    };
    let group = match &args.group {
        Some(g) => quote!(::core::option::Option::Some(#g)),
        None => none,
    };
    let catch_up = format_ident!("{}", args.catch_up);
    let jitter_ms = args.jitter_ms;
    let future = quote! {
        ::messaging::__private::BoxFuture<'static, ::core::result::Result<Self::Output, ::messaging::__private::BoxError>>
    };
    quote! {
        #func

        const _: () = {
            // What is particular to this schedule. Everything else is generic
            // over it, so that a return type that is not a message is
            // reported once, at the user's token.
            trait __MessagingSchedule: 'static {
                type Output: ::messaging::__private::ScheduleOutput;
                fn build(
                    tick: ::messaging::__private::Tick,
                    resources: ::std::sync::Arc<::messaging::__private::Resources>,
                ) -> #future;
            }

            struct __MessagingThis;

            impl __MessagingSchedule for __MessagingThis {
                #output_type
                fn build(
                    tick: ::messaging::__private::Tick,
                    resources: ::std::sync::Arc<::messaging::__private::Resources>,
                ) -> #future {
                    ::std::boxed::Box::pin(async move {
                        #(#extract)*
                        ::core::result::Result::Ok(#call)
                    })
                }
            }

            fn __messaging_build<S: __MessagingSchedule>(
                tick: ::messaging::__private::Tick,
                resources: ::std::sync::Arc<::messaging::__private::Resources>,
            ) -> ::messaging::__private::BoxFuture<
                'static,
                ::core::result::Result<
                    ::core::option::Option<::messaging::__private::Encoded>,
                    ::messaging::__private::BoxError,
                >,
            > {
                ::std::boxed::Box::pin(async move {
                    ::messaging::__private::encode_scheduled(S::build(tick, resources).await?)
                })
            }

            fn __messaging_fifo_rules<S: __MessagingSchedule>()
            where
                #fifo_bound
            {
            }

            #fifo_check

            fn __messaging_queue() -> ::messaging::__private::QueueSpec {
                #queue_spec
            }

            fn __messaging_requirements() -> ::std::vec::Vec<::messaging::__private::Requirement> {
                let all: ::std::vec::Vec<::core::option::Option<::messaging::__private::Requirement>> =
                    ::std::vec![#(#requirements),*];
                all.into_iter().flatten().collect()
            }

            ::messaging::__private::inventory::submit! {
                ::messaging::__private::ScheduleEntry {
                    name: #name,
                    function: #path,
                    queue_type: ::core::stringify!(#queue),
                    queue: __messaging_queue,
                    cron: #cron,
                    zone: #zone,
                    every_ms: #every,
                    catch_up: ::messaging::__private::CatchUp::#catch_up,
                    group: #group,
                    jitter_ms: #jitter_ms,
                    requirements: __messaging_requirements,
                    build: __messaging_build::<__MessagingThis>,
                }
            }
        };
    }
}
