//! `cargo run -p edit_form [database.sqlite] [address]`, then open
//! <http://127.0.0.1:3000/items/1/edit> in two tabs and save in both.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "edit_form.sqlite".to_owned());
    let address = args.next().unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let pool = edit_form::setup(&path)?;
    let listener = tokio::net::TcpListener::bind(&address).await?;
    println!("http://{}/items/1/edit", listener.local_addr()?);
    axum::serve(listener, edit_form::app(pool)).await?;
    Ok(())
}
