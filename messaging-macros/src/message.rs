//! `#[messaging::message]`: parse the options, check them, generate
//! `impl Message`, the compile-time upcast checks and the registration.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::{Data, DeriveInput, Ident, LitStr, Path};

use crate::attr::{with_error, Args, Errors, Reader};

const KNOWN: &[&str] = &["name", "v", "upcast", "id", "group"];

struct MessageArgs {
    name: Option<LitStr>,
    version: u32,
    upcast: Option<Path>,
    id: Option<Ident>,
    group: Option<Ident>,
}

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let result = syn::parse2::<DeriveInput>(item.clone())
        .map_err(|_| syn::Error::new(Span::call_site(), "`#[messaging::message]` goes on a struct or an enum"))
        .and_then(|input| {
            let args = syn::parse2::<Args>(args)?;
            let checked = parse(args, &input)?;
            Ok(generate(&input, item.clone(), &checked))
        });
    match result {
        Ok(tokens) => tokens,
        Err(e) => with_error(item, e),
    }
}

fn parse(args: Args, input: &DeriveInput) -> syn::Result<MessageArgs> {
    let mut errors = Errors::default();
    if !input.generics.params.is_empty() {
        errors.push(input.generics.span_or(input.ident.span()), "message types cannot be generic; declare one type per message");
    }
    let mut name = args.positional;
    let (mut version, mut upcast, mut id, mut group) = (None, None, None, None);
    {
        let mut reader = Reader::new("message", KNOWN, &mut errors);
        for arg in &args.args {
            if !reader.accept(&arg.key) {
                continue;
            }
            match arg.key.to_string().as_str() {
                "name" => name = reader.string(arg).or(name),
                "v" => match reader.int(arg) {
                    Some((0, span)) => reader.errors.push(span, "`v = 0` is not a version: versions start at 1 (`v = 1`)"),
                    Some((v, span)) if v > u64::from(u32::MAX) => reader.errors.push(span, "`v` is too large"),
                    Some((v, span)) => version = Some((v as u32, span)),
                    None => {}
                },
                "upcast" => upcast = reader.path(arg, "OrderPlaced"),
                "id" => id = reader.ident(arg),
                "group" => group = reader.ident(arg),
                _ => {}
            }
        }
    }
    if let Some(name) = &name {
        let value = name.value();
        if value.is_empty() || value.len() > 128 || value.chars().any(|c| c.is_whitespace() || c == '"') {
            errors.push(name.span(), "a message name is 1 to 128 characters without spaces or quotes, e.g. \"orders.placed\"");
        }
    } else {
        if let Some((_, span)) = version {
            errors.push(span, "`v` needs a `name`: the envelope carries both, e.g. `name = \"orders.placed\", v = 2`");
        }
        if let Some(up) = &upcast {
            errors.push(syn::spanned::Spanned::span(up), "`upcast` needs a `name` and `v`: only versioned messages can be upcast");
        }
    }
    for field in [&id, &group].into_iter().flatten() {
        check_field(input, field, &mut errors);
    }
    errors.finish()?;
    Ok(MessageArgs { name, version: version.map_or(1, |(v, _)| v), upcast, id, group })
}

trait SpanOr {
    fn span_or(&self, fallback: Span) -> Span;
}

impl SpanOr for syn::Generics {
    fn span_or(&self, fallback: Span) -> Span {
        self.params.first().map_or(fallback, syn::spanned::Spanned::span)
    }
}

/// `id = field` / `group = field` must name a field of the struct.
fn check_field(input: &DeriveInput, field: &Ident, errors: &mut Errors) {
    let Data::Struct(data) = &input.data else {
        errors.push(field.span(), "`id` and `group` name a field, so they apply only to structs with named fields");
        return;
    };
    let names: Vec<String> = data.fields.iter().filter_map(|f| f.ident.as_ref().map(ToString::to_string)).collect();
    if !names.contains(&field.to_string()) {
        errors.push(
            field.span(),
            format!("`{field}` is not a field of `{}`; its fields are: {}", input.ident, names.join(", ")),
        );
    }
}

fn generate(input: &DeriveInput, item: TokenStream, m: &MessageArgs) -> TokenStream {
    let ident = &input.ident;
    let version = m.version;
    let name = match &m.name {
        Some(n) => quote!(::core::option::Option::Some(#n)),
        None => quote!(::core::option::Option::None),
    };
    let has_group = if m.group.is_some() { quote!(::messaging::__private::Yes) } else { quote!(::messaging::__private::No) };
    let group_fn = m.group.as_ref().map(|field| {
        quote_spanned! {field.span()=>
            fn group_id(&self) -> ::core::option::Option<::std::string::String> {
                ::messaging::__private::identity(&self.#field)
            }
        }
    });
    let id_fn = m.id.as_ref().map(|field| {
        quote_spanned! {field.span()=>
            fn message_id(&self) -> ::core::option::Option<::std::string::String> {
                ::messaging::__private::identity(&self.#field)
            }
        }
    });
    let (upcast_entry, upcast_checks) = match (&m.upcast, &m.name) {
        (Some(target), Some(lit)) => {
            let span = syn::spanned::Spanned::span(target);
            let next = version + 1;
            let target_text = quote!(#target).to_string().replace(' ', "");
            let name_value = lit.value();
            let wrong_name = format!(
                "`upcast = {target_text}`: the target must be another version of \"{name_value}\"; give `{target_text}` `name = \"{name_value}\"`, or upcast to the type that has it"
            );
            let wrong_version = format!(
                "`upcast = {target_text}`: the target must be version {next} of \"{name_value}\" (this type is v{version}); declare `{target_text}` with `v = {next}`, or upcast to the v{next} type"
            );
            let checks = quote_spanned! {span=>
                const _: () = {
                    if !::messaging::__private::const_name_is(<#target as ::messaging::Message>::NAME, #lit) {
                        ::core::panic!(#wrong_name);
                    }
                    if <#target as ::messaging::Message>::VERSION != #next {
                        ::core::panic!(#wrong_version);
                    }
                };
                const _: fn() = ::messaging::__private::assert_upcast::<#ident, #target>;
            };
            let entry = quote! {
                ::core::option::Option::Some(::messaging::__private::Upcast {
                    target: ::messaging::__private::type_id::<#target>,
                    target_name: ::core::stringify!(#target),
                    apply: ::messaging::__private::upcast::<#ident, #target>,
                })
            };
            (entry, checks)
        }
        _ => (quote!(::core::option::Option::None), quote!()),
    };
    quote! {
        #item

        impl ::messaging::Message for #ident {
            const NAME: ::core::option::Option<&'static str> = #name;
            const VERSION: u32 = #version;
            type HasGroup = #has_group;
            #group_fn
            #id_fn
        }

        #upcast_checks

        const _: () = {
            ::messaging::__private::inventory::submit! {
                ::messaging::__private::MessageEntry {
                    type_name: ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#ident)),
                    type_id: ::messaging::__private::type_id::<#ident>,
                    name: #name,
                    version: #version,
                    upcast: #upcast_entry,
                    decode: ::messaging::__private::decode::<#ident>,
                }
            }
        };
    }
}
