//! The statements of the operations, built once: the blocking mode runs them
//! on [`AnyConnection`](lockkit_tests::support::AnyConnection), the `--async`
//! mode on diesel-async's connections. Only their execution differs.

use diesel::dsl;
use diesel::prelude::*;

use crate::config::Bump;
use crate::schema::*;
use crate::stats::Op;

/// Line `line_no` of the order `op`: `qty` of `item`.
fn order_line(
    op_id: i64,
    line_no: i32,
    item: i32,
    qty: i32,
    strategy: &'static str,
) -> dsl::Values<OrderLineInsert, OrderLineValues> {
    diesel::insert_into(torture_order_lines::table).values((
        torture_order_lines::op_id.eq(op_id),
        torture_order_lines::line_no.eq(line_no),
        torture_order_lines::item_id.eq(item),
        torture_order_lines::qty.eq(qty),
        torture_order_lines::strategy.eq(strategy),
    ))
}

/// The order lines of `op`, one `INSERT` each.
pub fn order_lines(
    op: &Op,
) -> impl Iterator<Item = dsl::Values<OrderLineInsert, OrderLineValues>> + '_ {
    op.lines.iter().enumerate().map(|(line_no, (item, qty))| {
        order_line(op.id, line_no as i32, *item, *qty, op.strategy.name())
    })
}

/// The shipment job `op` enqueues, if it sells.
pub fn shipment_job(
    op: &Op,
) -> Option<dsl::Values<dsl::insert_into<torture_jobs::table>, ShipmentValues>> {
    op.strategy.sells().then(|| {
        diesel::insert_into(torture_jobs::table)
            .values((torture_jobs::id.eq(op.id), torture_jobs::done.eq(false)))
    })
}

/// The `INSERT` of one order line, before its values.
pub type OrderLineInsert = dsl::insert_into<torture_order_lines::table>;
/// The values of one order line.
pub type OrderLineValues = (
    dsl::Eq<torture_order_lines::op_id, i64>,
    dsl::Eq<torture_order_lines::line_no, i32>,
    dsl::Eq<torture_order_lines::item_id, i32>,
    dsl::Eq<torture_order_lines::qty, i32>,
    dsl::Eq<torture_order_lines::strategy, &'static str>,
);
/// The values of a shipment job.
pub type ShipmentValues = (
    dsl::Eq<torture_jobs::id, i64>,
    dsl::Eq<torture_jobs::done, bool>,
);

/// The row `id` of the items table, to update.
pub type ItemRow = dsl::update<dsl::Find<torture_items::table, i32>>;

/// `lock_version = lock_version + 1`.
pub type NextVersion =
    dsl::Eq<torture_items::lock_version, dsl::Add<torture_items::lock_version, i32>>;

/// A plain write of the stock (the row is locked): bumping the version itself
/// only with `--bump explicit` (lockkit's lock already did).
pub enum SetStock {
    Explicit(dsl::Set<ItemRow, (dsl::Eq<torture_items::stock, i32>, NextVersion)>),
    Plain(dsl::Set<ItemRow, dsl::Eq<torture_items::stock, i32>>),
}

/// The stock write of item `id` under `--bump`.
pub fn set_stock(id: i32, stock: i32, bump: Bump) -> SetStock {
    let row = torture_items::table.find(id);
    match bump {
        Bump::Explicit => SetStock::Explicit(diesel::update(row).set((
            torture_items::stock.eq(stock),
            torture_items::lock_version.eq(torture_items::lock_version + 1),
        ))),
        Bump::Trigger | Bump::Lockkit | Bump::None => {
            SetStock::Plain(diesel::update(row).set(torture_items::stock.eq(stock)))
        }
    }
}

/// Item `id`, unlocked (every column, in [`Item`](crate::model::Item)'s order): what an
/// optimistic writer or a client reads.
pub fn read_item(id: i32) -> dsl::Find<torture_items::table, i32> {
    torture_items::table.find(id)
}

/// How many rows of `Table` an op wrote, `OpId` being its column of the op.
pub type RowsOf<Table, OpId> = dsl::Count<dsl::Filter<Table, dsl::Eq<OpId, i64>>>;

/// How many order lines `op` wrote: after it was interrupted, whether it committed.
pub fn lines_of(op: i64) -> RowsOf<torture_order_lines::table, torture_order_lines::op_id> {
    torture_order_lines::table
        .filter(torture_order_lines::op_id.eq(op))
        .count()
}

/// How many jobs claim `op` ran.
pub fn runs_of(op: i64) -> RowsOf<torture_job_runs::table, torture_job_runs::op_id> {
    torture_job_runs::table
        .filter(torture_job_runs::op_id.eq(op))
        .count()
}
