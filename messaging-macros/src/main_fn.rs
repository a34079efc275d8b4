//! `#[messaging::main]`: check the function, wrap its body into a setup hook
//! and hand it to the runtime's command line.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::spanned::Spanned;
use syn::ItemFn;

use crate::attr::{with_error, Errors};

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let result = syn::parse2::<ItemFn>(item.clone())
        .map_err(|_| syn::Error::new(Span::call_site(), "`#[messaging::main]` goes on `async fn main`"))
        .and_then(|func| {
            let mut errors = Errors::default();
            if !args.is_empty() {
                errors.push(args.span(), "`#[messaging::main]` takes no options; configure the app in its body with `setup`");
            }
            check(&func, &mut errors);
            errors.finish()?;
            Ok(generate(func))
        });
    match result {
        Ok(tokens) => tokens,
        Err(e) => with_error(item, e),
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
    if sig.inputs.len() > 1 {
        errors.push(
            sig.inputs.span(),
            "`main` takes nothing or one argument: `async fn main(setup: &mut messaging::Setup)`",
        );
    }
}

fn generate(func: ItemFn) -> TokenStream {
    let ItemFn { attrs, vis, mut sig, block } = func;
    let name = sig.ident.clone();
    let call = if sig.inputs.is_empty() { quote!(__messaging_main().await) } else { quote!(__messaging_main(setup).await) };
    sig.ident = syn::Ident::new("__messaging_main", name.span());
    quote! {
        #(#attrs)*
        #vis fn #name() -> ::std::process::ExitCode {
            #sig #block

            fn __messaging_hook(
                setup: &mut ::messaging::Setup,
            ) -> ::messaging::BoxFuture<'_, ::messaging::__private::SetupResult> {
                let _ = &setup;
                ::std::boxed::Box::pin(async move {
                    ::messaging::__private::IntoSetupResult::into_setup_result(#call)
                })
            }

            ::messaging::__private::run_main(__messaging_hook)
        }
    }
}
