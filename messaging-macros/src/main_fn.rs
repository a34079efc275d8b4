//! `#[messaging::main]`: check the function, wrap its body into a setup hook
//! and hand it to the runtime's command line.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, ReturnType, Type};

use crate::attr::{with_error, Errors};

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let func = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            let error = syn::Error::new(Span::call_site(), "`#[messaging::main]` goes on `async fn main`");
            return with_error(item, error);
        }
    };
    let mut errors = Errors::default();
    if !args.is_empty() {
        errors.push(args.span(), "`#[messaging::main]` takes no options; configure the app in its body with `setup`");
    }
    check(&func, &mut errors);
    match errors.finish() {
        Ok(()) => generate(func),
        Err(e) => {
            let mut out = fallback(func);
            out.extend(e.into_compile_error());
            out
        }
    }
}

fn check(func: &ItemFn, errors: &mut Errors) {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        errors.push(sig.fn_token.span(), "`#[messaging::main]` needs an async function: write `async fn main`");
    }
    if !sig.generics.params.is_empty() {
        errors.push(sig.generics.span(), "`main` cannot be generic");
    }
    for extra in sig.inputs.iter().skip(1) {
        errors.push(
            extra.span(),
            "`main` takes at most one argument, the setup (`setup: &mut messaging::Setup`): remove this one",
        );
    }
    match sig.inputs.first() {
        Some(FnArg::Receiver(r)) => errors.push(r.span(), "`main` is a free function: remove `self`"),
        Some(FnArg::Typed(arg)) if !matches!(&*arg.ty, Type::Reference(r) if r.mutability.is_some()) => {
            errors.push(arg.ty.span(), "the setup is lent to `main`, not given: write `setup: &mut messaging::Setup`")
        }
        _ => {}
    }
}

/// The service's entry point: the user's function becomes the setup hook.
fn generate(func: ItemFn) -> TokenStream {
    let ItemFn { attrs, vis, mut sig, block } = func;
    let name = sig.ident.clone();
    let call = match sig.inputs.first() {
        None => quote!(__messaging_main().await),
        // Spanned at the argument's type, so that a wrong type is reported there.
        Some(arg) => quote_spanned! {arg.span()=> __messaging_main(setup).await },
    };
    // The output converts through a local trait, so that a wrong return type
    // is reported at it, in our words, without the runtime's internals.
    let body = match &sig.output {
        ReturnType::Default => quote! {
            #call;
            ::core::result::Result::Ok(())
        },
        ReturnType::Type(_, ty) => {
            let convert = quote_spanned! {ty.span()=> <#ty as SetupOutput>::into_setup_result(output) };
            quote! {
                let output = #call;
                #convert
            }
        }
    };
    sig.ident = syn::Ident::new("__messaging_main", name.span());
    quote! {
        #(#attrs)*
        #vis fn #name() -> ::std::process::ExitCode {
            #sig #block

            #[diagnostic::on_unimplemented(
                message = "`#[messaging::main]` cannot return `{Self}`",
                label = "expected nothing or `Result<(), E>`",
                note = "return nothing, or a `Result<(), E>` whose error converts into `Box<dyn std::error::Error + Send + Sync>` (e.g. `anyhow::Result<()>`)"
            )]
            trait SetupOutput {
                fn into_setup_result(self) -> ::messaging::__private::SetupResult;
            }

            #[diagnostic::do_not_recommend]
            impl<T: ::messaging::__private::IntoSetupResult> SetupOutput for T {
                fn into_setup_result(self) -> ::messaging::__private::SetupResult {
                    ::messaging::__private::IntoSetupResult::into_setup_result(self)
                }
            }

            fn __messaging_hook(
                setup: &mut ::messaging::__private::Setup,
            ) -> ::messaging::__private::BoxFuture<'_, ::messaging::__private::SetupResult> {
                let _ = &setup;
                ::std::boxed::Box::pin(async move { #body })
            }

            ::messaging::__private::run_app(
                __messaging_hook,
                match ::core::option_env!("CARGO_BIN_NAME") {
                    ::core::option::Option::Some(name) => name,
                    ::core::option::Option::None => ::core::env!("CARGO_PKG_NAME"),
                },
                ::core::env!("CARGO_PKG_VERSION"),
            )
        }
    }
}

/// What an invalid `main` expands to besides the errors: the function kept
/// whole (so that its body is still checked) inside a `main` that does
/// nothing, so that rustc adds no error of its own about `main`.
fn fallback(func: ItemFn) -> TokenStream {
    let ItemFn { attrs, vis, mut sig, block } = func;
    let name = sig.ident.clone();
    sig.ident = syn::Ident::new("__messaging_main", name.span());
    quote! {
        #(#attrs)*
        #vis fn #name() -> ::std::process::ExitCode {
            #[allow(dead_code)]
            #sig #block

            ::std::process::ExitCode::FAILURE
        }
    }
}
