//! The HTML. Every value from the database or the form is escaped.

use crate::merge::{Fields, Merged};
use crate::schema::Item;

/// Escapes text for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\
         <style>body{{font-family:sans-serif;max-width:44rem;margin:2rem auto;color:#222}}\
         table{{border-collapse:collapse;margin:1rem 0}}td,th{{border:1px solid #bbb;padding:.4rem .8rem;text-align:left}}\
         .clash{{background:#fde2e2}}.notice{{background:#e6f4ea;padding:.5rem}}.warning{{background:#fff4d6;padding:.5rem}}\
         label{{display:block;margin:.5rem 0}}</style></head>\n<body>{body}</body></html>\n",
        title = escape(title),
    )
}

/// The form: the values `shown`, and hidden the `version` they go with and the
/// `original` values (those the person started from, for [`merge`](crate::merge)).
fn form(id: i32, shown: &Fields, original: &Fields, version: i32, button: &str) -> String {
    format!(
        "<form id=\"edit\" method=\"post\" action=\"/items/{id}\">\
         <label>Name <input id=\"name\" name=\"name\" value=\"{name}\"></label>\
         <label>Stock <input id=\"stock\" name=\"stock\" type=\"number\" value=\"{stock}\"></label>\
         <input type=\"hidden\" name=\"lock_version\" value=\"{version}\">\
         <input type=\"hidden\" name=\"orig_name\" value=\"{orig_name}\">\
         <input type=\"hidden\" name=\"orig_stock\" value=\"{orig_stock}\">\
         <button id=\"save\" type=\"submit\">{button}</button></form>",
        name = escape(&shown.name),
        stock = shown.stock,
        orig_name = escape(&original.name),
        orig_stock = original.stock,
        button = escape(button),
    )
}

/// The edit page of `item`; `saved` after a successful save.
pub fn edit(item: &Item, saved: bool) -> String {
    let notice = if saved {
        "<p id=\"saved\" class=\"notice\">Saved.</p>"
    } else {
        ""
    };
    let fields = Fields {
        name: item.name.clone(),
        stock: item.stock,
    };
    page(
        &format!("Edit {}", item.name),
        &format!(
            "<h1>Edit item {id}</h1>{notice}<p>Version <span id=\"version\">{version}</span></p>{form}",
            id = item.id,
            version = item.lock_version,
            form = form(item.id, &fields, &fields, item.lock_version, "Save"),
        ),
    )
}

/// The conflict page: someone saved `current` since the person loaded the page.
pub fn conflict(mine: &Fields, current: &Item, merged: &Merged) -> String {
    let row = |field: &'static str, mine: String, current: String, saved: String| {
        let class = if merged.clashes.contains(&field) {
            " class=\"clash\""
        } else {
            ""
        };
        format!(
            "<tr{class} id=\"row-{field}\"><th>{field}</th><td class=\"mine\">{}</td><td class=\"current\">{}</td><td class=\"merged\">{}</td></tr>",
            escape(&mine),
            escape(&current),
            escape(&saved),
        )
    };
    let clashes = if merged.clashes.is_empty() {
        String::new()
    } else {
        format!(
            "<p class=\"warning\">You both changed <b>{}</b>: your value is in the form below; check it before saving.</p>",
            escape(&merged.clashes.join(", "))
        )
    };
    page(
        "Edit conflict",
        &format!(
            "<h1 id=\"conflict\">Someone else saved this item while you were editing</h1>\
             <p>Nothing of yours was saved yet. The item is now at version {version}.</p>{clashes}\
             <table><tr><th></th><th>Your values</th><th>Stored now</th><th>Will be saved</th></tr>{name}{stock}</table>\
             <p>Saving applies the fields you changed to the current version and keeps the other person's changes to the rest.</p>\
             {form}<p><a id=\"discard\" href=\"/items/{id}/edit\">Discard my changes</a></p>",
            version = current.lock_version,
            name = row("name", mine.name.clone(), current.name.clone(), merged.fields.name.clone()),
            stock = row("stock", mine.stock.to_string(), current.stock.to_string(), merged.fields.stock.to_string()),
            form = form(
                current.id,
                &merged.fields,
                &Fields { name: current.name.clone(), stock: current.stock },
                current.lock_version,
                "Save on the current version",
            ),
            id = current.id,
        ),
    )
}

/// A page with one message, for the errors.
pub fn message(title: &str, text: &str) -> String {
    page(
        title,
        &format!("<h1>{}</h1><p>{}</p>", escape(title), escape(text)),
    )
}
