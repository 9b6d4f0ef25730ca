//! NVML field values read with a `scopeId`.
//!
//! Why: some NVML fields are per link, and `scopeId` picks the link, or `u32::MAX` for the sum
//! over all links (nvml.h, "NVLink throughput counters field values": "A scopeId of UINT_MAX
//! returns aggregate value summed up across all links"). nvml-wrapper's
//! `Device::field_values_for` zeroes every `nvmlFieldValue_t`, so it always reads link 0;
//! reading `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX` through it would report one link of the
//! H200's eighteen. This crate makes the same `nvmlDeviceGetFieldValues` call with the scope
//! set, behind one safe function.

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings::{
    nvmlFieldValue_t, nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
};

/// `scopeId` that asks for the sum over all links.
pub const ALL_LINKS: u32 = u32::MAX;

/// Reads `(field id, scope id)` pairs of `device` in one `nvmlDeviceGetFieldValues` call.
/// The outer error is the call's (a missing symbol included: `FailedToLoadSymbol`, never a
/// panic); each inner result is that field's own `nvmlReturn`, its value when NVML gave an
/// unsigned 64-bit one, and `UnexpectedVariant(type)` for any other value type (the
/// throughput fields are documented as unsigned long long).
pub fn field_values_u64(
    device: &Device<'_>,
    fields: &[(u32, u32)],
) -> Result<Vec<Result<u64, NvmlError>>, NvmlError> {
    // The symbol is looked up through the library's table, which holds an error rather than
    // panicking when the driver lacks it (the raw `nvml.lib().nvmlX()` helpers panic).
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetFieldValues.as_ref())?;
    let mut values: Vec<nvmlFieldValue_t> = fields
        .iter()
        .map(|&(field, scope)| {
            // SAFETY: nvmlFieldValue_t is a plain C struct (integers and a union of numbers);
            // all-zero bytes are a valid value of it, as nvml-wrapper's own call builds it.
            let mut v: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
            v.fieldId = field;
            v.scopeId = scope;
            v
        })
        .collect();
    let count = i32::try_from(values.len()).map_err(|_| NvmlError::InvalidArg)?;
    // SAFETY: `device.handle()` is the live handle of a device of the `Nvml` that `device`
    // borrows (so NVML is initialised for the whole call); `values` holds exactly `count`
    // initialised elements that NVML fills in place and does not keep after returning.
    let code = unsafe { sym(device.handle(), count, values.as_mut_ptr()) };
    nvml_try(code)?;
    Ok(values
        .iter()
        .map(|v| {
            nvml_try(v.nvmlReturn)?;
            if v.valueType != nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG {
                return Err(NvmlError::UnexpectedVariant(v.valueType));
            }
            // SAFETY: NVML set valueType to unsigned long long, so `ullVal` is the member
            // it wrote.
            Ok(unsafe { v.value.ullVal })
        })
        .collect())
}
