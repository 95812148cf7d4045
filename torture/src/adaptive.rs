//! The adaptive strategy's sale: `lockkit::adaptive` on the process-wide policy,
//! so the hot rows turn locked and back as the workers race on them.

use lockkit::adaptive::{AdaptivePolicy, AdaptiveRow};
use lockkit::bounds::LockingConnection;
use lockkit::{AsLockingConnection, Error};

use crate::model::Item;

/// Takes `qty` from item `id`: the written row, or `None` when the fresh row
/// holds less (nothing written).
pub fn sell<C>(conn: &mut C, id: i32, qty: i32) -> Result<Option<Item>, Error>
where
    C: AsLockingConnection<Conn = C> + LockingConnection,
    Item: AdaptiveRow<C>,
{
    let sold = AdaptivePolicy::global().update(conn, id, |item: &mut Item| {
        if item.stock < qty {
            return Err(Error::NoRowMatched);
        }
        item.stock -= qty;
        Ok(())
    });
    match sold {
        Ok(item) => Ok(Some(item)),
        Err(Error::NoRowMatched) => Ok(None),
        Err(err) => Err(err),
    }
}
