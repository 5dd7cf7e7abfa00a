//! The hot calls, answered before the generated processor so their replies can be written from
//! cached row encodings (crate::reply): getRow, getRowWithColumns, getRows, getRowsWithColumns,
//! scannerGet and scannerGetList. Their arguments are read with the `thrift` crate's protocol
//! the way the generated code reads them (same field ids and types, unknown fields skipped, a
//! missing argument is its type's default, the last of a repeated field wins); a bad argument
//! gets the processor's exception reply and closes the connection. Every other call, and the
//! timestamped variants, go to the generated processor.

use crate::reply::{Declared, ListReply};
use crate::service::{Handler, RangeCache};
use crate::sidecar::codec::TS_LATEST;
use crate::transport::HotCalls;
use thrift::protocol::{field_id, TBinaryOutputProtocol, TInputProtocol, TMessageIdentifier, TMessageType, TType};
use thrift::{ApplicationError, ApplicationErrorKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    GetRow,
    GetRowWithColumns,
    GetRows,
    GetRowsWithColumns,
    ScannerGet,
    ScannerGetList,
}

/// What an argument field holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arg {
    Table,
    Row,
    Rows,
    Columns,
    Attributes,
    ScannerId,
    RowsWanted,
}

impl Call {
    pub fn from_name(name: &str) -> Option<Call> {
        Some(match name {
            "getRow" => Call::GetRow,
            "getRowWithColumns" => Call::GetRowWithColumns,
            "getRows" => Call::GetRows,
            "getRowsWithColumns" => Call::GetRowsWithColumns,
            "scannerGet" => Call::ScannerGet,
            "scannerGetList" => Call::ScannerGetList,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Call::GetRow => "getRow",
            Call::GetRowWithColumns => "getRowWithColumns",
            Call::GetRows => "getRows",
            Call::GetRowsWithColumns => "getRowsWithColumns",
            Call::ScannerGet => "scannerGet",
            Call::ScannerGetList => "scannerGetList",
        }
    }

    /// The argument with field id `id` (crates/rangecache/idl/hbase1.thrift).
    fn arg(self, id: i16) -> Option<Arg> {
        use Call::*;
        Some(match (self, id) {
            (ScannerGet | ScannerGetList, 1) => Arg::ScannerId,
            (ScannerGetList, 2) => Arg::RowsWanted,
            (ScannerGet | ScannerGetList, _) => return None,
            (_, 1) => Arg::Table,
            (GetRow | GetRowWithColumns, 2) => Arg::Row,
            (GetRows | GetRowsWithColumns, 2) => Arg::Rows,
            (GetRowWithColumns | GetRowsWithColumns, 3) => Arg::Columns,
            (GetRow | GetRows, 3) | (GetRowWithColumns | GetRowsWithColumns, 4) => Arg::Attributes,
            _ => return None,
        })
    }
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Args {
    table: Vec<u8>,
    row: Vec<u8>,
    rows: Vec<Vec<u8>>,
    columns: Vec<Vec<u8>>,
    id: i32,
    n: i32,
}

fn read_texts(i: &mut dyn TInputProtocol) -> thrift::Result<Vec<Vec<u8>>> {
    let l = i.read_list_begin()?;
    let mut v = Vec::with_capacity(l.size as usize);
    for _ in 0..l.size {
        v.push(i.read_bytes()?);
    }
    i.read_list_end()?;
    Ok(v)
}

fn read_args(call: Call, i: &mut dyn TInputProtocol) -> thrift::Result<Args> {
    let mut a = Args::default();
    i.read_struct_begin()?;
    loop {
        let f = i.read_field_begin()?;
        if f.field_type == TType::Stop {
            break;
        }
        match call.arg(field_id(&f)?) {
            Some(Arg::Table) => a.table = i.read_bytes()?,
            Some(Arg::Row) => a.row = i.read_bytes()?,
            Some(Arg::Rows) => a.rows = read_texts(i)?,
            Some(Arg::Columns) => a.columns = read_texts(i)?,
            Some(Arg::Attributes) => {
                // Read and ignored, as by the handler.
                let m = i.read_map_begin()?;
                for _ in 0..m.size {
                    i.read_bytes()?;
                    i.read_bytes()?;
                }
                i.read_map_end()?;
            }
            Some(Arg::ScannerId) => a.id = i.read_i32()?,
            Some(Arg::RowsWanted) => a.n = i.read_i32()?,
            None => i.skip(f.field_type)?,
        }
        i.read_field_end()?;
    }
    i.read_struct_end()?;
    Ok(a)
}

/// Reads the arguments of `call` and appends its reply to `out`.
pub fn answer(
    rc: &RangeCache,
    call: Call,
    seq: i32,
    input: &mut dyn TInputProtocol,
    out: &mut Vec<u8>,
) -> thrift::Result<()> {
    let args = match read_args(call, input) {
        Ok(a) => a,
        Err(e) => {
            // What the generated processor answers (thrift::server::handle_process_result); the
            // caller then closes the connection, the rest of the message being unknown.
            let app = match &e {
                thrift::Error::Application(a) => ApplicationError::new(a.kind, a.message.clone()),
                other => ApplicationError::new(ApplicationErrorKind::Unknown, format!("{other:?}")),
            };
            let mut p = TBinaryOutputProtocol::new(&mut *out, true);
            let ident = TMessageIdentifier::new(call.name(), TMessageType::Exception, seq);
            let _ = thrift::protocol::TOutputProtocol::write_message_begin(&mut p, &ident)
                .and_then(|()| thrift::Error::write_application_error_to_out_protocol(&app, &mut p));
            return Err(e);
        }
    };
    let mut w = ListReply::begin(out, call.name(), seq);
    let r: Result<(), Declared> = match call {
        Call::GetRow | Call::GetRowWithColumns => {
            rc.get_rows(&args.table, &[args.row], args.columns, TS_LATEST, &mut w)
        }
        Call::GetRows | Call::GetRowsWithColumns => {
            rc.get_rows(&args.table, &args.rows, args.columns, TS_LATEST, &mut w)
        }
        Call::ScannerGet => rc.scanner_next(args.id, 1, &mut w),
        Call::ScannerGetList => rc.scanner_next(args.id, args.n, &mut w),
    };
    match r {
        Ok(()) => w.finish(),
        Err(e) => w.fail(e),
    }
    Ok(())
}

impl HotCalls for Handler {
    fn answer(
        &self,
        name: &str,
        seq: i32,
        input: &mut dyn TInputProtocol,
        out: &mut Vec<u8>,
    ) -> Option<thrift::Result<()>> {
        let call = Call::from_name(name)?;
        Some(answer(&self.0, call, seq, input, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use thrift::protocol::{
        TBinaryInputProtocol, TFieldIdentifier, TListIdentifier, TMapIdentifier, TOutputProtocol, TStructIdentifier,
    };

    fn encoded(f: impl FnOnce(&mut dyn TOutputProtocol)) -> Vec<u8> {
        let mut v = Vec::new();
        let mut p = TBinaryOutputProtocol::new(&mut v, true);
        p.write_struct_begin(&TStructIdentifier::new("args")).unwrap();
        f(&mut p);
        p.write_field_stop().unwrap();
        v
    }

    #[test]
    fn arguments_are_read_as_the_generated_code_reads_them() {
        // getRowsWithColumns with attributes, an unknown field, and the table repeated (last wins).
        let b = encoded(|p| {
            p.write_field_begin(&TFieldIdentifier::new("t", TType::String, 1)).unwrap();
            p.write_bytes(b"old").unwrap();
            p.write_field_begin(&TFieldIdentifier::new("rows", TType::List, 2)).unwrap();
            p.write_list_begin(&TListIdentifier::new(TType::String, 2)).unwrap();
            p.write_bytes(b"a").unwrap();
            p.write_bytes(b"b").unwrap();
            p.write_field_begin(&TFieldIdentifier::new("x", TType::I64, 9)).unwrap();
            p.write_i64(7).unwrap();
            p.write_field_begin(&TFieldIdentifier::new("attrs", TType::Map, 4)).unwrap();
            p.write_map_begin(&TMapIdentifier::new(TType::String, TType::String, 1)).unwrap();
            p.write_bytes(b"k").unwrap();
            p.write_bytes(b"v").unwrap();
            p.write_field_begin(&TFieldIdentifier::new("t", TType::String, 1)).unwrap();
            p.write_bytes(b"t").unwrap();
        });
        let mut i = TBinaryInputProtocol::new(&b[..], true);
        let a = read_args(Call::GetRowsWithColumns, &mut i).unwrap();
        assert_eq!(a, Args { table: b"t".to_vec(), rows: vec![b"a".to_vec(), b"b".to_vec()], ..Default::default() });
        // scannerGetList; missing fields are defaults.
        let b = encoded(|p| {
            p.write_field_begin(&TFieldIdentifier::new("n", TType::I32, 2)).unwrap();
            p.write_i32(100).unwrap();
        });
        let mut i = TBinaryInputProtocol::new(&b[..], true);
        let a = read_args(Call::ScannerGetList, &mut i).unwrap();
        assert_eq!((a.id, a.n), (0, 100));
        assert_eq!(Call::from_name("getRowTs"), None, "timestamped variants go to the processor");
    }
}
