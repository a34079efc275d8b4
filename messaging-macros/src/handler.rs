//! `#[messaging::handler]`: parse the options and the signature, check them,
//! generate the type-erased handler and its registration.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, LitStr, Path, ReturnType, Type};

use crate::attr::{mentions_impl, with_error, Args, Errors, Reader};

const KNOWN: &[&str] = &["queue", "idempotent", "lease", "retry", "timeout"];

struct HandlerArgs {
    queue: Path,
    idempotent: Option<(LitStr, u64)>,
    retry: Option<(u64, u64)>,
    timeout: Option<u64>,
}

/// The checked signature: the message type and the extractor types.
struct Signature {
    message: Type,
    extractors: Vec<Type>,
}

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let result = syn::parse2::<ItemFn>(item.clone())
        .map_err(|_| syn::Error::new(Span::call_site(), "`#[messaging::handler]` goes on an `async fn`"))
        .and_then(|func| {
            let mut errors = Errors::default();
            let args = syn::parse2::<Args>(args).map_err(|e| {
                errors.push_error(e);
            });
            let checked_args = args.ok().and_then(|a| parse_args(a, &mut errors));
            let signature = parse_signature(&func, &mut errors);
            errors.finish()?;
            match (checked_args, signature) {
                (Some(a), Some(s)) => Ok(generate(&func, &a, &s)),
                _ => Err(syn::Error::new(Span::call_site(), "invalid handler")),
            }
        });
    match result {
        Ok(tokens) => tokens,
        Err(e) => with_error(item, e),
    }
}

fn parse_args(args: Args, errors: &mut Errors) -> Option<HandlerArgs> {
    if let Some(lit) = &args.positional {
        errors.push(lit.span(), "name the queue type: `#[messaging::handler(queue = Orders)]`");
    }
    let (mut queue, mut scope, mut lease, mut lease_span, mut retry) = (None, None, None, None, None);
    let mut timeout = None;
    let mut reader = Reader::new("handler", KNOWN, errors);
    for arg in &args.args {
        if !reader.accept(&arg.key) {
            continue;
        }
        match arg.key.to_string().as_str() {
            "queue" => queue = reader.path(arg, "Orders"),
            "idempotent" => match reader.string(arg) {
                Some(s) if s.value().is_empty() || s.value().len() > 128 => reader.errors.push(
                    s.span(),
                    "the idempotency scope is 1 to 128 characters, e.g. `idempotent = \"order-finalize\"`",
                ),
                other => scope = other,
            },
            "lease" => {
                lease_span = Some(arg.key.span());
                lease = reader.duration(arg).map(|(ms, _)| ms);
            }
            "timeout" => match reader.duration(arg) {
                Some((0, span)) => reader.errors.push(
                    span,
                    "`timeout` must be longer than zero: it is how long the handler may run, e.g. `timeout = \"5m\"`",
                ),
                Some((ms, _)) => timeout = Some(ms),
                None => {}
            },
            "retry" => {
                let Some(items) = reader.list(arg) else { continue };
                let (mut base, mut max) = (1_000, 300_000);
                let mut nested = Reader::new("handler(retry(..))", &["base", "max"], reader.errors);
                for item in items {
                    if !nested.accept(&item.key) {
                        continue;
                    }
                    let value = nested.duration(item);
                    match (item.key.to_string().as_str(), value) {
                        ("base", Some((ms, _))) => base = ms,
                        ("max", Some((ms, _))) => max = ms,
                        _ => {}
                    }
                }
                if base == 0 || max < base {
                    reader.errors.push(arg.key.span(), "`retry` needs `base` > 0 and `max` ≥ `base`");
                }
                retry = Some((base, max));
            }
            _ => {}
        }
    }
    if let (Some(span), None) = (lease_span, &scope) {
        errors.push(
            span,
            "`lease` is how long an idempotent handler holds its claim, so it needs \
             `idempotent = \"scope\"`: add it, or remove `lease`",
        );
    }
    if lease == Some(0) {
        errors.push(lease_span.unwrap_or_else(Span::call_site), "`lease` must be longer than zero");
    }
    let Some(queue) = queue else {
        errors.push(
            Span::call_site(),
            "missing `queue = ...`: name the queue this handler consumes, e.g. `#[messaging::handler(queue = Orders)]`",
        );
        return None;
    };
    Some(HandlerArgs { queue, idempotent: scope.map(|s| (s, lease.unwrap_or(30_000))), retry, timeout })
}

fn parse_signature(func: &ItemFn, errors: &mut Errors) -> Option<Signature> {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        errors
            .push(sig.fn_token.span(), format!("a handler must be an `async fn`: write `async fn {}(..)`", sig.ident));
    }
    if !sig.generics.params.is_empty() {
        errors.push(sig.generics.params.span(), "a handler cannot be generic; write one handler per message type");
    }
    let mut types = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(r) => errors.push(r.span(), "a handler is a free function, not a method: remove `self`"),
            FnArg::Typed(pat) => types.push((*pat.ty).clone()),
        }
    }
    if types.is_empty() {
        errors.push(
            sig.paren_token.span.join(),
            format!(
                "a handler's first argument is the message it handles: write `async fn {}(message: YourMessage, ..)`",
                sig.ident
            ),
        );
        return None;
    }
    if let Type::Reference(r) = &types[0] {
        errors.push(r.span(), "the handler receives the message by value: remove the `&`");
    }
    let message = types.remove(0);
    Some(Signature { message, extractors: types })
}

fn generate(func: &ItemFn, args: &HandlerArgs, sig: &Signature) -> TokenStream {
    let fn_name = &func.sig.ident;
    let queue = &args.queue;
    let message = &sig.message;
    let arg_names: Vec<_> = (0..sig.extractors.len()).map(|i| format_ident!("__arg{}", i)).collect();
    // Every use of a user's type is spanned at it and goes through its trait
    // (`<T as Trait>::item`), so that a type that is not a queue, a message or
    // an extractor is reported once, at the user's token, in the trait's words.
    let extract = sig.extractors.iter().zip(&arg_names).map(|(ty, name)| {
        quote_spanned! {ty.span()=>
            let #name = <#ty as ::messaging::__private::FromContext>::from_context(&ctx, &resources)?;
        }
    });
    let requirements = sig.extractors.iter().map(|ty| {
        quote_spanned! {ty.span()=> <#ty as ::messaging::__private::FromContext>::requirement() }
    });
    let queue_spec = quote_spanned! {queue.span()=> <#queue as ::messaging::__private::Queue>::SPEC };
    let message_type = quote_spanned! {message.span()=> type Message: ::messaging::__private::Message; };
    let output = quote_spanned! {func.sig.ident.span()=> output };
    let into_result = match &func.sig.output {
        ReturnType::Default => quote! { let () = #output; ::core::result::Result::Ok(()) },
        ReturnType::Type(_, ty) if !mentions_impl(ty) => quote_spanned! {ty.span()=>
            <#ty as ::messaging::__private::IntoHandlerResult>::into_handler_result(#output)
        },
        ReturnType::Type(_, ty) => quote_spanned! {ty.span()=>
            ::messaging::__private::IntoHandlerResult::into_handler_result(#output)
        },
    };
    let idempotency = match &args.idempotent {
        Some((scope, lease)) => quote! {
            ::core::option::Option::Some(::messaging::__private::IdempotencySpec {
                scope: #scope,
                lease: ::messaging::__private::Duration::from_millis(#lease),
            })
        },
        None => quote!(::core::option::Option::None),
    };
    let retry = match args.retry {
        Some((base, max)) => quote! {
            ::core::option::Option::Some(::messaging::__private::RetryPolicy {
                base: ::messaging::__private::Duration::from_millis(#base),
                max: ::messaging::__private::Duration::from_millis(#max),
            })
        },
        None => quote!(::core::option::Option::None),
    };
    let timeout = match args.timeout {
        Some(ms) => quote!(::core::option::Option::Some(::messaging::__private::Duration::from_millis(#ms))),
        None => quote!(::core::option::Option::None),
    };
    quote! {
        #func

        const _: () = {
            // What is particular to this handler. Everything else is generic
            // over it, so that it type-checks even if the message type is wrong.
            trait __MessagingHandler: ::core::marker::Send + ::core::marker::Sync + 'static {
                #message_type
                fn call(
                    message: Self::Message,
                    ctx: ::messaging::__private::MessageContext,
                    resources: ::std::sync::Arc<::messaging::__private::Resources>,
                ) -> ::messaging::__private::BoxFuture<'static, ::core::result::Result<(), ::messaging::__private::HandlerError>>;
            }

            struct __MessagingThis;

            impl __MessagingHandler for __MessagingThis {
                type Message = #message;
                fn call(
                    message: Self::Message,
                    ctx: ::messaging::__private::MessageContext,
                    resources: ::std::sync::Arc<::messaging::__private::Resources>,
                ) -> ::messaging::__private::BoxFuture<'static, ::core::result::Result<(), ::messaging::__private::HandlerError>> {
                    ::std::boxed::Box::pin(async move {
                        #(#extract)*
                        let #output = #fn_name(message, #(#arg_names),*).await;
                        #into_result
                    })
                }
            }

            struct __MessagingErased<S>(::core::marker::PhantomData<fn() -> S>);

            impl<S: __MessagingHandler> ::messaging::__private::ErasedHandler for __MessagingErased<S> {
                fn call(
                    &self,
                    message: ::messaging::__private::AnyMessage,
                    ctx: ::messaging::__private::MessageContext,
                    resources: ::std::sync::Arc<::messaging::__private::Resources>,
                ) -> ::messaging::__private::BoxFuture<'static, ::core::result::Result<(), ::messaging::__private::HandlerError>> {
                    match ::messaging::__private::downcast::<S::Message>(message) {
                        ::core::result::Result::Ok(message) => S::call(message, ctx, resources),
                        ::core::result::Result::Err(e) => {
                            ::std::boxed::Box::pin(async move { ::core::result::Result::Err(e) })
                        }
                    }
                }
            }

            fn __messaging_make<S: __MessagingHandler>() -> ::std::sync::Arc<dyn ::messaging::__private::ErasedHandler> {
                ::std::sync::Arc::new(__MessagingErased::<S>(::core::marker::PhantomData))
            }

            fn __messaging_queue() -> ::messaging::__private::QueueSpec {
                #queue_spec
            }

            fn __messaging_requirements() -> ::std::vec::Vec<::messaging::__private::Requirement> {
                let all: ::std::vec::Vec<::core::option::Option<::messaging::__private::Requirement>> =
                    ::std::vec![#(#requirements),*];
                all.into_iter().flatten().collect()
            }

            struct __MessagingEntry<S>(::core::marker::PhantomData<S>);

            impl<S: __MessagingHandler> __MessagingEntry<S> {
                const ENTRY: ::messaging::__private::HandlerEntry = ::messaging::__private::HandlerEntry {
                    name: ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#fn_name)),
                    queue_type: ::core::stringify!(#queue),
                    queue: __messaging_queue,
                    message_type: ::messaging::__private::type_id::<S::Message>,
                    message_type_name: ::core::stringify!(#message),
                    message_name: <S::Message as ::messaging::__private::Message>::NAME,
                    message_version: <S::Message as ::messaging::__private::Message>::VERSION,
                    decode: ::messaging::__private::decode::<S::Message>,
                    idempotency: #idempotency,
                    retry: #retry,
                    timeout: #timeout,
                    requirements: __messaging_requirements,
                    handler: __messaging_make::<S>,
                };
            }

            ::messaging::__private::inventory::submit! {
                __MessagingEntry::<__MessagingThis>::ENTRY
            }
        };
    }
}
