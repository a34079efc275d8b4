//! `#[messaging::message]`: parse the options, check them, generate
//! `impl Message`, the compile-time upcast checks and the registration.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Ident, LitStr, Path, Type};

use crate::attr::{with_error, Args, Errors, Reader};

const KNOWN: &[&str] = &["name", "v", "upcast", "id", "group"];

struct MessageArgs {
    name: Option<LitStr>,
    version: u32,
    upcast: Option<Path>,
    /// `id = field`, with the field's type when the field exists.
    id: Option<(Ident, Option<Type>)>,
    /// `group = field`, with the field's type when the field exists.
    group: Option<(Ident, Option<Type>)>,
}

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let input = match syn::parse2::<DeriveInput>(item.clone()) {
        Ok(input) => input,
        Err(_) => {
            let error = syn::Error::new(Span::call_site(), "`#[messaging::message]` goes on a struct or an enum");
            return with_error(item, error);
        }
    };
    let args = match syn::parse2::<Args>(args) {
        Ok(args) => args,
        Err(e) => return with_error(item, e),
    };
    let mut errors = Errors::default();
    let checked = parse(args, &input, &mut errors);
    // Even when an option is wrong, the type still implements `Message` (with
    // what could be read), so that the code using it reports nothing more
    // than the option itself.
    let mut out = if input.generics.params.is_empty() { generate(&input, item, &checked) } else { item };
    if let Err(e) = errors.finish() {
        out.extend(e.into_compile_error());
    }
    out
}

fn parse(args: Args, input: &DeriveInput, errors: &mut Errors) -> MessageArgs {
    if !input.generics.params.is_empty() {
        errors.push(
            input.generics.span_or(input.ident.span()),
            "message types cannot be generic; declare one type per message",
        );
    }
    let mut name = args.positional;
    let (mut version, mut upcast, mut id, mut group) = (None, None, None, None);
    {
        let mut reader = Reader::new("message", KNOWN, errors);
        for arg in &args.args {
            if !reader.accept(&arg.key) {
                continue;
            }
            match arg.key.to_string().as_str() {
                "name" => name = reader.string(arg).or(name),
                "v" => match reader.int(arg) {
                    Some((0, span)) => {
                        reader.errors.push(span, "`v = 0` is not a version: versions start at 1, write `v = 1`")
                    }
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
            errors.push(
                name.span(),
                "a message name is 1 to 128 characters without spaces or quotes, e.g. \
                 \"orders.placed\"",
            );
        }
    } else {
        if let Some((_, span)) = version {
            errors.push(span, "`v` needs a `name`: the envelope carries both, e.g. `name = \"orders.placed\", v = 2`");
        }
        if let Some(up) = &upcast {
            errors.push(
                syn::spanned::Spanned::span(up),
                "`upcast` needs a `name` and `v`: only versioned messages can be upcast",
            );
        }
    }
    if let (Some(up), Some((u32::MAX, _))) = (&upcast, version) {
        errors.push(up.span(), "the last possible version cannot be upcast");
    }
    let id = id.map(|field| {
        let ty = field_type(input, &field, "id", errors);
        (field, ty)
    });
    let group = group.map(|field| {
        let ty = field_type(input, &field, "group", errors);
        (field, ty)
    });
    MessageArgs { upcast: upcast.filter(|_| name.is_some()), name, version: version.map_or(1, |(v, _)| v), id, group }
}

trait SpanOr {
    fn span_or(&self, fallback: Span) -> Span;
}

impl SpanOr for syn::Generics {
    fn span_or(&self, fallback: Span) -> Span {
        self.params.first().map_or(fallback, syn::spanned::Spanned::span)
    }
}

/// `id = field` / `group = field` must name a field of the struct: its type.
fn field_type(input: &DeriveInput, field: &Ident, key: &str, errors: &mut Errors) -> Option<Type> {
    let Data::Struct(data) = &input.data else {
        errors.push(
            field.span(),
            format!("`{key} = {field}` names a field, so it applies only to structs with named fields"),
        );
        return None;
    };
    let found = data.fields.iter().find(|f| f.ident.as_ref() == Some(field));
    if found.is_none() {
        let names: Vec<String> =
            data.fields.iter().filter_map(|f| f.ident.as_ref().map(|i| format!("`{i}`"))).collect();
        let message = if names.is_empty() {
            format!("`{key} = {field}`: `{}` has no named fields; `{key}` names a field of the struct", input.ident)
        } else {
            format!("`{key} = {field}`: `{}` has no field `{field}`; its fields are {}", input.ident, names.join(", "))
        };
        errors.push(field.span(), message);
    }
    found.map(|f| f.ty.clone())
}

fn generate(input: &DeriveInput, item: TokenStream, m: &MessageArgs) -> TokenStream {
    let ident = &input.ident;
    let version = m.version;
    let name = match &m.name {
        Some(n) => quote!(::core::option::Option::Some(#n)),
        None => quote!(::core::option::Option::None),
    };
    // `group = field` makes the type carry its group even when the field is
    // misspelt, so that publishing it reports nothing more.
    let has_group =
        if m.group.is_some() { quote!(::messaging::__private::Yes) } else { quote!(::messaging::__private::No) };
    // The field's type is named in the call (`<T as IdentityField>`), so that
    // a field that is not string-like is reported once, at `group = field`,
    // without notes about the framework's internals.
    let identity_fn = |method: &str, field: &Option<(Ident, Option<Type>)>| {
        let (field, Some(ty)) = field.as_ref()? else {
            return None;
        };
        // The type's tokens get the span of `group = field`, where the error
        // belongs: the choice of the field, not the field itself, is wrong.
        let ty = respan(quote!(#ty), field.span());
        let method = Ident::new(method, Span::call_site());
        Some(quote_spanned! {field.span()=>
            fn #method(&self) -> ::core::option::Option<::std::string::String> {
                <#ty as ::messaging::__private::IdentityField>::identity(&self.#field)
            }
        })
    };
    let group_fn = identity_fn("group_id", &m.group);
    let id_fn = identity_fn("message_id", &m.id);
    let (upcast_entry, upcast_items) = match (&m.upcast, &m.name) {
        (Some(target), Some(lit)) => upcast(ident, target, lit, version),
        _ => (quote!(::core::option::Option::None), quote!()),
    };
    quote! {
        #item

        impl ::messaging::__private::Message for #ident {
            const NAME: ::core::option::Option<&'static str> = #name;
            const VERSION: u32 = #version;
            type HasGroup = #has_group;
            #group_fn
            #id_fn
        }

        const _: () = {
            #upcast_items

            ::messaging::__private::inventory::submit! {
                ::messaging::__private::MessageEntry {
                    type_name: ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#ident)),
                    type_id: ::messaging::__private::type_id::<#ident>,
                    name: #name,
                    version: #version,
                    upcast: #upcast_entry,
                    decode: ::messaging::__private::decode::<#ident>,
                    encode: ::messaging::__private::encode::<#ident>,
                }
            }
        };
    }
}

/// The checks of `upcast = Target` and the registry's upcast edge.
///
/// The name and version are compared in a constant, whose panic message is
/// the error. `From<Self>` is required through a local trait, so that a
/// missing impl is reported once, at `upcast = Target`, in our words.
fn upcast(ident: &Ident, target: &Path, lit: &LitStr, version: u32) -> (TokenStream, TokenStream) {
    let span = target.span();
    let next = version + 1;
    let target_text = quote!(#target).to_string().replace(' ', "");
    let name_value = lit.value();
    let wrong_name = format!(
        "`upcast = {target_text}`: `{target_text}` is not a version of \"{name_value}\"; an \
         upcast goes to the next version of the same message: give `{target_text}` \
         `name = \"{name_value}\"`, or upcast to the type that has it"
    );
    let wrong_version = format!(
        "`upcast = {target_text}`: the target must be version {next} of \"{name_value}\" (this type \
         is v{version}); declare `{target_text}` with `v = {next}`, or upcast to the v{next} type"
    );
    let items = quote_spanned! {span=>
        // Named so that the error says which check failed. Like every free
        // constant, it is evaluated although nothing uses it.
        #[allow(dead_code)]
        const UPCAST_TARGET_IS_THE_NEXT_VERSION: () = {
            if !::messaging::__private::const_name_is(<#target as ::messaging::__private::Message>::NAME, #lit) {
                ::core::panic!(#wrong_name);
            }
            if <#target as ::messaging::__private::Message>::VERSION != #next {
                ::core::panic!(#wrong_version);
            }
        };

        #[diagnostic::on_unimplemented(
            message = "`upcast = {Self}` needs `impl From<{Old}> for {Self}`",
            label = "`{Self}` cannot be built from `{Old}`",
            note = "add `impl From<{Old}> for {Self}`: it turns a decoded `{Old}` into the next version"
        )]
        trait UpcastFrom<Old> {
            const APPLY: fn(::messaging::__private::AnyMessage)
                -> ::core::option::Option<::messaging::__private::AnyMessage>;
        }

        #[diagnostic::do_not_recommend]
        impl<Old, New> UpcastFrom<Old> for New
        where
            Old: ::core::any::Any,
            New: ::core::convert::From<Old> + ::core::marker::Send + 'static,
        {
            const APPLY: fn(::messaging::__private::AnyMessage)
                -> ::core::option::Option<::messaging::__private::AnyMessage> = |message| {
                let old = message.downcast::<Old>().ok()?;
                let new: ::messaging::__private::AnyMessage =
                    ::std::boxed::Box::new(<New as ::core::convert::From<Old>>::from(*old));
                ::core::option::Option::Some(new)
            };
        }
    };
    let apply = quote_spanned! {span=> <#target as UpcastFrom<#ident>>::APPLY };
    let entry = quote! {
        ::core::option::Option::Some(::messaging::__private::Upcast {
            target: ::messaging::__private::type_id::<#target>,
            target_name: ::core::stringify!(#target),
            apply: #apply,
        })
    };
    (entry, items)
}

/// The tokens with every span replaced by `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let proc_macro2::TokenTree::Group(group) = &token {
                let mut new = proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                new.set_span(span);
                token = proc_macro2::TokenTree::Group(new);
            }
            token.set_span(span);
            token
        })
        .collect()
}
