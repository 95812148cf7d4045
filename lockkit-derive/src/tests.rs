//! Expansion snapshots and error collection, calling the derive as a
//! `proc_macro2` function. The compile-fail suite (what a user sees from rustc)
//! lives in the `lockkit-tests` crate, `tests/ui/`.

use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;
use syn::DeriveInput;

use crate::expand::{derive_lockable, derive_versioned};

/// Snapshots the input and its expansion, both pretty-printed.
macro_rules! assert_expansion {
    ($($input:tt)*) => {{
        let input: DeriveInput = syn::parse_quote!($($input)*);
        insta::assert_snapshot!(expand(&input));
    }};
}

/// The input, then its expansion; panics if the derive reported errors.
fn expand(input: &DeriveInput) -> String {
    let tokens = derive_versioned(input);
    let errors = compile_errors(tokens.clone());
    assert!(errors.is_empty(), "unexpected errors: {errors:#?}");
    format!(
        "{}\n// ---- expands to ----\n\n{}",
        pretty(input.to_token_stream()),
        pretty(tokens)
    )
}

fn pretty(tokens: TokenStream) -> String {
    prettyplease::unparse(&syn::parse2::<syn::File>(tokens).unwrap())
}

/// The messages of every `compile_error!` in the derive's output.
fn errors(input: DeriveInput) -> Vec<String> {
    compile_errors(derive_versioned(&input))
}

/// The derive's errors for `input`, checked to be exactly as many as `starts`,
/// in order, each beginning with its `starts` entry.
fn assert_errors_start_with(input: DeriveInput, starts: &[&str]) -> Vec<String> {
    let errors = errors(input);
    assert_eq!(errors.len(), starts.len(), "{errors:#?}");
    for (error, start) in errors.iter().zip(starts) {
        assert!(error.starts_with(start), "{start:?}: {errors:#?}");
    }
    errors
}

/// The messages of every `compile_error!` in the output, in order, wherever it
/// sits (the fallback puts the first one in a type).
fn compile_errors(tokens: TokenStream) -> Vec<String> {
    syn::parse2::<syn::File>(tokens.clone()).expect("the derive emits items");
    let mut messages = Vec::new();
    collect_compile_errors(tokens, &mut messages);
    messages
}

fn collect_compile_errors(tokens: TokenStream, messages: &mut Vec<String>) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    for (i, token) in tokens.iter().enumerate() {
        match (token, tokens.get(i + 1), tokens.get(i + 2)) {
            (
                TokenTree::Ident(name),
                Some(TokenTree::Punct(bang)),
                Some(TokenTree::Group(body)),
            ) if name == "compile_error" && bang.as_char() == '!' => {
                let message: syn::LitStr = syn::parse2(body.stream()).unwrap();
                messages.push(message.value());
            }
            (TokenTree::Group(group), _, _) => collect_compile_errors(group.stream(), messages),
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------
// Expansions

#[test]
fn lockable_without_a_version() {
    let input: DeriveInput = syn::parse_quote! {
        #[diesel(table_name = jobs)]
        pub struct Job {
            pub id: i64,
            pub payload: String,
        }
    };
    let tokens = derive_lockable(&input);
    assert!(compile_errors(tokens.clone()).is_empty());
    insta::assert_snapshot!(pretty(tokens));
}

#[test]
fn lockable_rejects_a_version_marker() {
    let input: DeriveInput = syn::parse_quote! {
        pub struct Job {
            pub id: i64,
            #[lockkit(version)]
            pub rev: i32,
        }
    };
    let errors = compile_errors(derive_lockable(&input));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("has no effect on `Lockable`"),
        "{errors:?}"
    );
    assert!(
        errors[0].contains("help: write `#[derive(Versioned)]`"),
        "{errors:?}"
    );
}

/// A `Lockable` model that reads the version column: its locks would not
/// advance the version, and an editor holding a `Versioned` copy of the row
/// would write over the locked writer's change.
#[test]
fn lockable_refuses_the_version_column() {
    for field in [
        quote::quote!(pub lock_version: i32),
        quote::quote!(#[diesel(column_name = lock_version)] pub rev: i64),
        quote::quote!(#[diesel(column_name = r#lock_version)] pub rev: i64),
        quote::quote!(pub r#lock_version: i32),
    ] {
        let input: DeriveInput = syn::parse_quote! {
            pub struct Item {
                pub id: i32,
                #field,
            }
        };
        let errors = compile_errors(derive_lockable(&input));
        assert_eq!(errors.len(), 1, "{field}: {errors:?}");
        assert!(
            errors[0].starts_with(
                "a `Lockable` model's locks do not advance the version in `lock_version`"
            ),
            "{errors:?}"
        );
        assert!(
            errors[0].contains("help: write `#[derive(Versioned)]`"),
            "{errors:?}"
        );
    }
}

/// `Item`, with an `i32` key and `lock_version`, its table named `table`.
fn item_in(table: syn::Path) -> DeriveInput {
    syn::parse_quote! {
        #[diesel(table_name = #table)]
        pub struct Item {
            pub id: i32,
            pub name: String,
            pub stock: i32,
            pub lock_version: i32,
        }
    }
}

#[test]
fn plain_item() {
    insta::assert_snapshot!(expand(&item_in(syn::parse_quote!(items))));
}

#[test]
fn marked_i16_version_with_column_name() {
    assert_expansion! {
        #[diesel(table_name = gadgets)]
        pub struct Gadget {
            pub id: i32,
            pub label: String,
            #[lockkit(version)]
            #[diesel(column_name = version)]
            pub revision: i16,
        }
    }
}

#[test]
fn composite_primary_key() {
    assert_expansion! {
        #[diesel(table_name = order_lines, primary_key(order_id, line_no))]
        pub struct OrderLine {
            pub order_id: i32,
            pub line_no: i32,
            pub qty: i32,
            pub lock_version: i32,
        }
    }
}

#[test]
fn option_field_skipped_when_none() {
    assert_expansion! {
        #[diesel(table_name = documents)]
        pub struct Document {
            pub id: i64,
            pub title: String,
            pub note: Option<String>,
            pub lock_version: i64,
        }
    }
}

#[test]
fn an_option_from_a_macro_fragment_is_skipped_when_none() {
    // A `macro_rules!` type fragment (`$t`) reaches the derive in an invisible
    // group: its `Option` is still one that Diesel skips when `None`.
    let plain: DeriveInput = syn::parse_quote! {
        #[diesel(table_name = documents)]
        pub struct Document {
            pub id: i64,
            pub note: Option<String>,
            pub lock_version: i64,
        }
    };
    let mut grouped = plain.clone();
    let syn::Data::Struct(data) = &mut grouped.data else {
        unreachable!()
    };
    let note = data.fields.iter_mut().nth(1).unwrap();
    note.ty = syn::Type::Group(syn::TypeGroup {
        group_token: Default::default(),
        elem: Box::new(note.ty.clone()),
    });
    assert_eq!(expand(&grouped), expand(&plain));
    assert!(expand(&grouped).contains("BySql"));
}

#[test]
fn several_table_names_are_refused() {
    // As Diesel's single-table derives (`AsChangeset`, `Selectable`) refuse
    // them: lockkit writes one table, and would otherwise pick one.
    let input: DeriveInput = syn::parse_quote! {
        #[diesel(table_name = items)]
        #[diesel(table_name = items_history)]
        pub struct Item {
            pub id: i32,
            pub stock: i32,
            pub lock_version: i32,
        }
    };
    assert_errors_start_with(input, &["expected a single table name attribute"]);
}

#[test]
fn option_field_treat_none_as_null() {
    assert_expansion! {
        #[diesel(table_name = documents, treat_none_as_null = true)]
        pub struct DocumentNullable {
            pub id: i64,
            pub title: String,
            pub note: Option<String>,
            pub lock_version: i64,
        }
    }
}

#[test]
fn option_field_treat_none_as_null_per_field() {
    // The field's setting wins over the struct's, in both directions.
    assert_expansion! {
        #[diesel(table_name = documents, treat_none_as_null = true)]
        pub struct Document {
            pub id: i64,
            #[diesel(treat_none_as_null = false)]
            pub title: Option<String>,
            pub note: Option<String>,
            pub lock_version: i64,
        }
    }
}

#[test]
fn skip_update_field() {
    assert_expansion! {
        #[diesel(table_name = items)]
        pub struct Item {
            pub id: i32,
            #[diesel(skip_update)]
            pub name: String,
            pub stock: i32,
            pub lock_version: i32,
        }
    }
}

#[test]
fn no_bump_and_updated_at_fields() {
    // Neither is in the changeset; `updated_at` rides on the version bump.
    assert_expansion! {
        #[diesel(table_name = posts)]
        pub struct Post {
            pub id: i32,
            pub title: String,
            #[lockkit(no_bump)]
            pub views: i64,
            #[lockkit(updated_at)]
            pub updated_at: Option<NaiveDateTime>,
            pub lock_version: i32,
        }
    }
}

#[test]
fn only_key_and_version() {
    // Nothing to write but the version bump: the changeset is an empty `Option`.
    assert_expansion! {
        #[diesel(table_name = items)]
        pub struct ItemVersion {
            pub id: i32,
            #[diesel(skip_update)]
            pub name: String,
            pub lock_version: i32,
        }
    }
}

#[test]
fn table_path() {
    insta::assert_snapshot!(expand(&item_in(syn::parse_quote!(crate::schema::items))));
}

#[test]
fn a_raw_table_name_is_named_without_its_prefix() {
    // In errors and metrics: "stale update of type 1", not "r#type 1".
    let expanded = expand(&item_in(syn::parse_quote!(r#type)));
    assert!(
        expanded.contains(r#"const TABLE_NAME: &'static str = "type";"#),
        "{expanded}"
    );
}

#[test]
fn inferred_table_name() {
    assert_expansion! {
        pub struct StockItem {
            pub id: i32,
            pub name: String,
            pub lock_version: i32,
        }
    }
}

#[test]
fn generics_and_i64_key() {
    // The struct's generics carry over; the changeset lifetime is the derive's own.
    assert_expansion! {
        #[diesel(table_name = documents)]
        pub struct DocumentRef<'a, T: Clone>
        where
            T: ::core::fmt::Debug,
        {
            pub id: i64,
            pub title: &'a str,
            pub extra: T,
            pub lock_version: i64,
        }
    }
}

// ---------------------------------------------------------------------------
// Errors

#[test]
fn fallback_on_errors() {
    // The errors, and the traits implemented anyway with erroneous types, so that
    // call sites add no errors of their own.
    let input: DeriveInput = syn::parse_quote! {
        pub struct Document<'a, T> {
            pub id: i64,
            #[lockkit(foo)]
            pub title: &'a str,
            pub extra: T,
            pub lock_version: Option<i64>,
        }
    };
    let tokens = derive_versioned(&input);
    assert_eq!(compile_errors(tokens.clone()).len(), 2);
    insta::assert_snapshot!(pretty(tokens));
}

#[test]
fn fallback_of_lockable() {
    let tokens = derive_lockable(&syn::parse_quote! {
        pub enum Job {}
    });
    assert_eq!(compile_errors(tokens.clone()).len(), 1);
    insta::assert_snapshot!(pretty(tokens));
}

#[test]
fn errors_are_collected_across_fields() {
    let errors = assert_errors_start_with(
        syn::parse_quote! {
            #[diesel(table_name = items)]
            pub struct Item {
                pub id: i32,
                #[lockkit(foo)]
                pub name: String,
                #[lockkit(version)]
                pub lock_version: String,
            }
        },
        &[
            "unknown lockkit attribute `foo`",
            "the version must be `i16`, `i32` or `i64`",
        ],
    );
    assert!(errors.iter().all(|e| e.contains("\nhelp: ")), "{errors:#?}");
}

#[test]
fn errors_are_collected_across_stages() {
    // An attribute error (reading) and a model error (validation) together.
    assert_errors_start_with(
        syn::parse_quote! {
            #[lockkit(version)]
            #[diesel(table_name = items, primary_key(code))]
            pub struct Item {
                pub id: i32,
                pub lock_version: i32,
            }
        },
        &[
            "`#[lockkit(version)]` is a field attribute, not allowed on the struct",
            "no field maps the primary key column `code`",
        ],
    );
}

/// How many times `lockkit` is named as an identifier in `tokens` (not
/// `__lockkit`, the generated code's alias).
fn lockkit_idents(tokens: TokenStream) -> usize {
    tokens
        .into_iter()
        .map(|token| match token {
            TokenTree::Ident(ident) => usize::from(ident == "lockkit"),
            TokenTree::Group(group) => lockkit_idents(group.stream()),
            _ => 0,
        })
        .sum()
}

#[test]
fn crate_path_is_the_only_way_to_lockkit() {
    // A crate that depends on lockkit under another name, or through a facade
    // that re-exports it: the generated code names lockkit once, by the path
    // given, and through its alias everywhere else.
    let versioned: DeriveInput = syn::parse_quote! {
        #[diesel(table_name = items)]
        #[lockkit(crate = "facade::locks")]
        pub struct Item { pub id: i32, pub name: String, pub lock_version: i32 }
    };
    let bare_path: DeriveInput = syn::parse_quote! {
        #[diesel(table_name = items)]
        #[lockkit(crate = facade::locks)]
        pub struct Item { pub id: i32, pub name: String, pub lock_version: i32 }
    };
    let lockable: DeriveInput = syn::parse_quote! {
        #[diesel(table_name = jobs)]
        #[lockkit(crate = "facade::locks")]
        pub struct Job { pub id: i32 }
    };
    for tokens in [
        derive_versioned(&versioned),
        derive_versioned(&bare_path),
        derive_lockable(&lockable),
    ] {
        let errors = compile_errors(tokens.clone());
        assert!(errors.is_empty(), "{errors:#?}");
        let text = tokens.to_string();
        assert!(
            text.contains("use facade :: locks as __lockkit ;"),
            "{text}"
        );
        assert_eq!(lockkit_idents(tokens), 0, "{text}");
    }
    // Without it, `::lockkit`, once.
    let tokens = derive_versioned(&syn::parse_quote! {
        pub struct Item { pub id: i32, pub lock_version: i32 }
    });
    assert!(tokens.to_string().contains("use :: lockkit as __lockkit ;"));
    assert_eq!(lockkit_idents(tokens), 1);
}

#[test]
fn crate_path_reaches_the_fallback() {
    // The fallback's impls name lockkit by the given path too: with another
    // error in the input, the user sees that error and nothing about lockkit.
    let tokens = derive_versioned(&syn::parse_quote! {
        #[lockkit(crate = "facade::locks")]
        pub struct Item { pub id: i32, pub lock_version: String }
    });
    assert_eq!(compile_errors(tokens.clone()).len(), 1);
    assert_eq!(lockkit_idents(tokens), 0);
}

#[test]
fn a_field_key_on_a_lockable_struct_says_to_derive_versioned() {
    let errors = compile_errors(derive_lockable(&syn::parse_quote! {
        #[lockkit(version)]
        pub struct Job { pub id: i32 }
    }));
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].contains("write `#[derive(Versioned)]` instead"),
        "{errors:#?}"
    );
}

#[test]
fn struct_attribute_mistakes() {
    assert_errors_start_with(
        syn::parse_quote! {
            #[lockkit(crate = "a", crate = "b")]
            #[lockkit(crate)]
            #[lockkit(krate = "a")]
            #[lockkit(no_bump)]
            #[lockkit(crate = "not a path")]
            pub struct Item { pub id: i32, pub lock_version: i32 }
        },
        &[
            "duplicate `#[lockkit(crate = ..)]`",
            "`crate` needs the path lockkit is reached by",
            "unknown lockkit attribute `krate` on the struct",
            "`#[lockkit(no_bump)]` is a field attribute, not allowed on the struct",
            "unexpected token",
        ],
    );
}

#[test]
fn errors_come_in_source_order() {
    // Found by different stages (reading attributes, the key, the version), but
    // reported in the order of the source, whichever stage found them.
    let errors = errors(syn::parse_quote! {
        #[diesel(table_name = items, primary_key(item_id))]
        pub struct Item {
            #[lockkit(versoin)]
            pub id: i32,
            #[lockkit(version)]
            pub a: i32,
            #[lockkit(version)]
            #[lockkit(foo)]
            pub b: i32,
        }
    });
    let first_lines: Vec<_> = errors.iter().map(|e| e.lines().next().unwrap()).collect();
    assert_eq!(
        first_lines,
        [
            "no field maps the primary key column `item_id`",
            "unknown lockkit attribute `versoin`",
            "more than one field is marked `#[lockkit(version)]`",
            "unknown lockkit attribute `foo`",
        ]
    );
}

#[test]
fn every_extra_version_mark_is_reported() {
    let extra = "more than one field is marked `#[lockkit(version)]`";
    assert_errors_start_with(
        syn::parse_quote! {
            pub struct Item {
                pub id: i32,
                #[lockkit(version)]
                pub a: i32,
                #[lockkit(version)]
                pub b: i32,
                #[lockkit(version)]
                pub c: i32,
            }
        },
        &[extra, extra],
    );
}

#[test]
fn no_version_field_and_missing_key() {
    assert_errors_start_with(
        syn::parse_quote! {
            pub struct Item {
                pub code: String,
                pub name: String,
            }
        },
        &[
            "no field maps the primary key column `id`",
            "`Item` has no version field",
        ],
    );
}

#[test]
fn valid_input_has_no_errors() {
    assert_eq!(
        errors(syn::parse_quote! {
            pub struct Item {
                pub id: i32,
                pub lock_version: i32,
            }
        }),
        Vec::<String>::new()
    );
}

#[test]
fn a_raw_lock_version_field_is_the_version() {
    // As `Lockable` refuses `r#lock_version` as the version column, `Versioned`
    // takes it as its version.
    assert_eq!(
        errors(syn::parse_quote! {
            pub struct Item {
                pub id: i32,
                pub r#lock_version: i32,
            }
        }),
        Vec::<String>::new()
    );
}

#[test]
fn a_missing_key_is_not_suggested_as_the_raw_version_field() {
    let errors = errors(syn::parse_quote! {
        pub struct Item {
            pub r#lock_version: i32,
            pub code: String,
        }
    });
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(errors[0].contains("primary_key(code)"), "{errors:#?}");
}

#[test]
fn diesel_keys_lockkit_does_not_read_are_skipped() {
    // Values of every shape Diesel takes: types with generics (no expressions),
    // expressions (no types), lists, and keys without a value.
    assert_eq!(
        errors(syn::parse_quote! {
            #[diesel(table_name = documents, check_for_backend(diesel::pg::Pg, diesel::sqlite::Sqlite))]
            #[diesel(base_query = documents::table.order_by(documents::id))]
            #[diesel(base_query_type = dsl::OrderBy<documents::table, documents::id>, aggregate)]
            pub struct Document {
                pub id: i64,
                #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
                pub note: Option<String>,
                #[diesel(
                    select_expression = documents::title.concat("!"),
                    select_expression_type = dsl::Concat<documents::title, &'static str>,
                    skip_update,
                )]
                pub title: String,
                #[diesel(deserialize_as = Option<i64>, treat_none_as_default_value = false)]
                pub lock_version: i64,
            }
        }),
        Vec::<String>::new()
    );
}

#[test]
fn every_error_is_one_line_then_a_help_line() {
    // lockkit's own errors and Diesel's, which lockkit repeats, in one layout.
    // (Where Diesel passes on syn's bare message, `table_name, ..` without `=`,
    // lockkit repeats that too: rustc shows the two derives' error once.)
    let inputs: [DeriveInput; 4] = [
        syn::parse_quote! {
            #[lockkit(version)]
            #[diesel(primary_key(code))]
            #[diesel(table_name)]
            pub struct Item {
                #[lockkit(version = 1, foo)]
                #[diesel(serialize_as = String)]
                pub name: String,
                #[lockkit(version)]
                #[lockkit(version)]
                pub lock_version: Option<String>,
            }
        },
        syn::parse_quote! {
            pub struct Item {
                #[lockkit(version)]
                pub id: f64,
            }
        },
        syn::parse_quote! { pub struct Item(i32); },
        syn::parse_quote! { pub enum Item {} },
    ];
    let errors: Vec<String> = inputs.into_iter().flat_map(errors).collect();
    assert!(errors.len() >= 10, "{errors:#?}");
    for error in &errors {
        let lines: Vec<_> = error.lines().collect();
        assert!(
            matches!(lines.as_slice(), [message, help] if !message.is_empty() && help.starts_with("help: ")),
            "{error}"
        );
    }
}

#[test]
fn malformed_diesel_keys_are_reported_as_diesel_reports_them() {
    // Word for word Diesel's messages: rustc shows the error of both derives once.
    let errors = errors(syn::parse_quote! {
        #[diesel(table_name)]
        #[diesel(primary_key)]
        #[diesel(treat_none_as_null)]
        pub struct Item {
            pub id: i32,
            #[diesel(column_name)]
            pub name: String,
            #[diesel(treat_none_as_null)]
            pub note: Option<String>,
            pub lock_version: i32,
        }
    });
    assert_eq!(
        errors,
        [
            "unexpected end of input, expected `=`\n\
             help: the correct format looks like `#[diesel(table_name = foo)]`",
            "unexpected end of input, expected parentheses\n\
             help: the correct format looks like `#[diesel(key1, key2)]`",
            "unexpected end of input, expected `=`\n\
             help: the correct format looks like `#[diesel(treat_none_as_null = true)]`",
            "unexpected end of input, expected `=`\n\
             help: the correct format looks like `#[diesel(column_name = foo)]`",
            "unexpected end of input, expected `=`\n\
             help: the correct format looks like `#[diesel(treat_none_as_null = true)]`",
        ]
    );
}

#[test]
fn diesel_attribute_forms_from_before_2_0_are_refused() {
    // Diesel's `with-deprecated` feature (on by default) still reads these:
    // lockkit, which reads only `#[diesel(..)]`, would write another table,
    // column or `None` than Diesel does.
    assert_errors_start_with(
        syn::parse_quote! {
            #[table_name = "archived_items"]
            #[primary_key(code)]
            #[changeset_options(treat_none_as_null = "true")]
            pub struct Item {
                pub code: i32,
                #[column_name = "label"]
                pub name: String,
                pub lock_version: i32,
            }
        },
        &[
            "`#[table_name = ..]` is Diesel's old attribute form",
            "`#[primary_key(..)]` is Diesel's old attribute form",
            "`#[changeset_options(..)]` is Diesel's old attribute form",
            // What the old `primary_key` said is not read either; the help
            // names the new form with the struct's own first field.
            "no field maps the primary key column `id`",
            "`#[column_name = ..]` is Diesel's old attribute form",
        ],
    );
}

#[test]
fn a_field_with_a_select_expression_is_not_written_back() {
    assert_errors_start_with(
        syn::parse_quote! {
            pub struct Item {
                pub id: i32,
                #[diesel(select_expression = items::name.concat("!"), select_expression_type = String)]
                pub shout: String,
                pub lock_version: i32,
            }
        },
        &["`update_versioned` cannot write a field with `#[diesel(select_expression)]`"],
    );
}

#[test]
fn a_second_field_on_the_version_or_a_key_column_is_refused() {
    assert_errors_start_with(
        syn::parse_quote! {
            pub struct Item {
                pub id: i32,
                #[diesel(column_name = id)]
                pub legacy_id: i32,
                #[diesel(column_name = lock_version)]
                pub etag: i32,
                pub lock_version: i32,
            }
        },
        &[
            "field `legacy_id` maps the primary key column `id`, as `id` does",
            "field `etag` maps the version column `lock_version`, as `lock_version` does",
        ],
    );
}

/// Every column the versioned write sets has one field: a second field on a
/// `no_bump` column would write back the count read, over the increments the
/// marker protects; on the `updated_at` column, or twice in the changeset, it
/// would assign the column twice. `r#name` is the column `name`.
/// The version on a key column would move the row to another key at every
/// write: refused, by its default name or marked.
#[test]
fn the_version_on_a_key_column_is_refused() {
    assert_errors_start_with(
        syn::parse_quote! {
            pub struct Item {
                pub id: i32,
                #[diesel(column_name = id)]
                pub lock_version: i32,
                pub stock: i32,
            }
        },
        &["field `lock_version` maps the primary key column `id`, as `id` does"],
    );
    assert_errors_start_with(
        syn::parse_quote! {
            pub struct Item {
                pub id: i32,
                #[lockkit(version)]
                #[diesel(column_name = r#id)]
                pub rev: i32,
            }
        },
        &["field `rev` maps the primary key column `id`, as `id` does"],
    );
}

#[test]
fn a_second_field_on_any_written_or_key_column_is_refused() {
    assert_errors_start_with(
        syn::parse_quote! {
            pub struct Item {
                pub id: i32,
                #[diesel(column_name = r#id)]
                pub legacy_id: i32,
                #[diesel(column_name = r#lock_version)]
                pub etag: i32,
                pub lock_version: i32,
                #[lockkit(no_bump)]
                pub views: i32,
                #[diesel(column_name = views)]
                pub views_seen: i32,
                #[lockkit(updated_at)]
                pub updated_at: Option<String>,
                #[diesel(column_name = updated_at)]
                pub touched: Option<String>,
                pub stock: i32,
                #[diesel(column_name = stock)]
                pub stock_again: i32,
                #[diesel(column_name = stock, skip_update)]
                pub stock_shown: i32,
            }
        },
        &[
            "field `legacy_id` maps the primary key column `id`, as `id` does",
            "field `etag` maps the version column `lock_version`, as `lock_version` does",
            "field `views_seen` maps the `no_bump` column `views`, as `views` does",
            "field `touched` maps the `updated_at` column `updated_at`, as `updated_at` does",
            "field `stock_again` maps the column `stock`, as `stock` does",
        ],
    );
}

#[test]
fn a_raw_struct_name_gives_its_table_without_a_panic() {
    let errors = errors(syn::parse_quote! {
        pub struct r#Item {
            pub id: i32,
            pub lock_version: i32,
        }
    });
    assert_eq!(errors, Vec::<String>::new());
}

#[test]
fn a_keyword_column_name_is_a_raw_identifier() {
    // As Diesel reads it: `items::r#type`, not `items::type`.
    for attr in [
        quote::quote!(#[diesel(column_name = "type")]),
        quote::quote!(#[diesel(column_name = type)]),
    ] {
        let input: DeriveInput = syn::parse_quote! {
            pub struct Item {
                pub id: i32,
                #attr
                pub kind: String,
                pub lock_version: i32,
            }
        };
        let out = expand(&input);
        assert!(out.contains("items::r#type"), "{out}");
    }
}

#[test]
fn a_column_name_that_cannot_be_raw_is_no_panic() {
    for name in ["self", "Self", "super", "crate"] {
        let input: DeriveInput = syn::parse_quote! {
            pub struct Item {
                pub id: i32,
                #[diesel(column_name = #name)]
                pub kind: String,
                pub lock_version: i32,
            }
        };
        // rustc refuses what comes out; the derive itself must not panic.
        let _ = derive_versioned(&input);
    }
}

#[test]
fn an_empty_primary_key_is_refused_at_its_attribute() {
    assert_errors_start_with(
        syn::parse_quote! {
            #[diesel(primary_key())]
            pub struct Item {
                pub id: i32,
                pub lock_version: i32,
            }
        },
        &["`primary_key` needs at least one column"],
    );
}

#[test]
fn a_raw_column_name_stays_raw() {
    let input: DeriveInput = syn::parse_quote! {
        pub struct Item {
            pub id: i32,
            #[diesel(column_name = r#type)]
            pub kind: String,
            pub lock_version: i32,
        }
    };
    let out = expand(&input);
    assert!(out.contains("items::r#type"), "{out}");
}
