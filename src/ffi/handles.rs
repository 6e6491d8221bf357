//! Every conversion between a raw pointer from C and a Rust value lives here,
//! so each handle type is converted one way only: `kvgate_config *` is a
//! `Box` of its builder, `kvgate_gate *` an `Arc` of its gate handle. Every
//! function checks for NULL (and alignment and size, for arrays) before
//! touching memory and says which argument was wrong.
//!
//! Which Rust value stands behind each handle is said next to that value's
//! definition ([`Castable`]), so this module names none of them and none of
//! their modules.

use std::mem::{align_of, size_of, MaybeUninit};

use super::error::Failure;
use crate::sync::Arc;

/// A C handle type and the Rust value behind it (rustls-ffi's `Castable`).
/// Implemented next to that value's definition; whether the handle is a
/// `Box` or an `Arc` is this module's choice, one per handle type.
pub(crate) trait Castable {
    /// The value a handle of this type points to.
    type Rust;
}

type Builder = <kvgate_config as Castable>::Rust;
type GateHandle = <kvgate_gate as Castable>::Rust;
type Waker = <kvgate_waker as Castable>::Rust;
type AttemptHandle = <kvgate_attempt as Castable>::Rust;

/// A configuration under construction (opaque; a `Box` of the Rust
/// `Config` and the host's probes).
///
/// Made by `kvgate_config_new`, changed by the `kvgate_config_set_*`
/// functions, read (not consumed) by `kvgate_new`, freed by
/// `kvgate_config_free`. Not thread-safe: do not use one builder from two
/// threads at once.
#[derive(Debug)]
pub struct kvgate_config {
    _private: [u8; 0],
}

/// An admission gate (opaque; an `Arc` of the gate and its lease registry).
///
/// Made by `kvgate_new`, freed once by `kvgate_free`. Thread-safe: every
/// function except `kvgate_free` may be called on one gate from any number
/// of threads at once.
#[derive(Debug)]
pub struct kvgate_gate {
    _private: [u8; 0],
}

/// A wake channel for event-loop attempts (opaque; an `Arc` of its
/// descriptor and tag queue, or of the host's callback).
///
/// Made by `kvgate_waker_new` or `kvgate_waker_new_callback`, freed once by
/// `kvgate_waker_free`; attempts begun with it keep it alive. Thread-safe.
#[derive(Debug)]
pub struct kvgate_waker {
    _private: [u8; 0],
}

/// An attempt to be admitted, driven step by step by an event loop
/// (opaque; a `Box` of the core's attempt).
///
/// Made by `kvgate_attempt_begin`, freed once by `kvgate_attempt_free`.
/// Its steps may be called from any thread, one at a time (concurrent calls
/// are serialised).
#[derive(Debug)]
pub struct kvgate_attempt {
    _private: [u8; 0],
}

/// The argument name, for messages.
type Arg = &'static str;

pub(crate) fn config_into_raw(config: Builder) -> *mut kvgate_config {
    Box::into_raw(Box::new(config)).cast()
}

/// # Safety
/// `ptr` is NULL or came from [`config_into_raw`] and was not freed, and no
/// other thread uses it for `'a`.
pub(crate) unsafe fn config_mut<'a>(
    ptr: *mut kvgate_config,
    arg: Arg,
) -> Result<&'a mut Builder, Failure> {
    // SAFETY: non-NULL pointers are live `Box<Builder>`s used by this thread only (caller).
    unsafe { ptr.cast::<Builder>().as_mut() }.ok_or_else(|| null(arg))
}

/// # Safety
/// `ptr` is NULL or came from [`config_into_raw`] and was not freed, and no
/// thread changes it for `'a`.
pub(crate) unsafe fn config_ref<'a>(
    ptr: *const kvgate_config,
    arg: Arg,
) -> Result<&'a Builder, Failure> {
    // SAFETY: non-NULL pointers are live `Box<Builder>`s not changed meanwhile (caller).
    unsafe { ptr.cast::<Builder>().as_ref() }.ok_or_else(|| null(arg))
}

/// Frees a builder; NULL is a no-op.
///
/// # Safety
/// `ptr` is NULL or came from [`config_into_raw`] and was not freed yet, and
/// nobody uses it any more.
pub(crate) unsafe fn config_free(ptr: *mut kvgate_config) {
    if !ptr.is_null() {
        // SAFETY: a live `Box<Builder>` handed back exactly once (caller).
        drop(unsafe { Box::from_raw(ptr.cast::<Builder>()) });
    }
}

pub(crate) fn gate_into_raw(handle: Arc<GateHandle>) -> *mut kvgate_gate {
    arc_into_raw(handle)
}

/// Borrows the handle for the duration of a call.
///
/// # Safety
/// `ptr` is NULL or came from [`gate_into_raw`] and `kvgate_free` is not
/// called on it during `'a` (the header's rule: free must not race with
/// another call on the same gate, except blocked `kvgate_acquire` calls,
/// which hold their own reference through [`gate_clone`]).
pub(crate) unsafe fn gate_ref<'a>(
    ptr: *mut kvgate_gate,
    arg: Arg,
) -> Result<&'a GateHandle, Failure> {
    // SAFETY: forwarded (caller).
    unsafe { arc_ref(ptr.cast_const(), arg) }
}

/// A counted reference to the handle, for calls that may still run after
/// `kvgate_free` began (blocking acquires): the memory stays alive until
/// the reference is dropped.
///
/// # Safety
/// As [`gate_ref`], at the moment of the call.
pub(crate) unsafe fn gate_clone(
    ptr: *mut kvgate_gate,
    arg: Arg,
) -> Result<Arc<GateHandle>, Failure> {
    // SAFETY: forwarded (caller).
    unsafe { arc_clone(ptr.cast_const(), arg) }
}

/// Takes back the host's reference; NULL gives `None`.
///
/// # Safety
/// `ptr` is NULL or came from [`gate_into_raw`] and is taken back exactly once.
pub(crate) unsafe fn gate_take(ptr: *mut kvgate_gate) -> Option<Arc<GateHandle>> {
    // SAFETY: forwarded (caller).
    unsafe { arc_take(ptr.cast_const()) }
}

// The handles that are an `Arc<T>` (`kvgate_gate *`, `kvgate_waker *`): the
// host holds one reference, from `arc_into_raw` until `arc_take`.

fn arc_into_raw<T, H>(value: Arc<T>) -> *mut H {
    Arc::into_raw(value).cast_mut().cast()
}

/// # Safety
/// `ptr` is NULL or came from [`arc_into_raw`] with this `T`, and the
/// host's reference is not taken back during `'a`.
unsafe fn arc_ref<'a, T, H>(ptr: *const H, arg: Arg) -> Result<&'a T, Failure> {
    // SAFETY: non-NULL pointers are live `Arc<T>` payloads (caller).
    unsafe { ptr.cast::<T>().as_ref() }.ok_or_else(|| null(arg))
}

/// A counted reference of its own, for whatever outlives the call.
///
/// # Safety
/// As [`arc_ref`], at the moment of the call.
unsafe fn arc_clone<T, H>(ptr: *const H, arg: Arg) -> Result<Arc<T>, Failure> {
    if ptr.is_null() {
        return Err(null(arg));
    }
    let ptr = ptr.cast::<T>();
    // SAFETY: `ptr` came from `Arc::into_raw` and that reference is still held
    // by the host (caller), so the count is at least one while we add ours.
    unsafe {
        Arc::increment_strong_count(ptr);
        Ok(Arc::from_raw(ptr))
    }
}

/// # Safety
/// `ptr` is NULL or came from [`arc_into_raw`] with this `T`, and is taken
/// back exactly once.
unsafe fn arc_take<T, H>(ptr: *const H) -> Option<Arc<T>> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the host's reference from `Arc::into_raw`, handed back once (caller).
    Some(unsafe { Arc::from_raw(ptr.cast::<T>()) })
}

/// A `(pointer, length)` array argument. A length of 0 gives the empty
/// slice whatever the pointer (NULL included).
///
/// # Safety
/// A non-NULL `ptr` points to `len` initialised `T`s that stay unchanged for `'a`.
pub(crate) unsafe fn slice_arg<'a, T>(
    ptr: *const T,
    len: usize,
    arg: Arg,
    len_arg: Arg,
) -> Result<&'a [T], Failure> {
    if len == 0 {
        return Ok(&[]);
    }
    check_array(ptr, len, arg, len_arg)?;
    // SAFETY: non-NULL, aligned, size within isize::MAX (checked); `len`
    // initialised elements that stay unchanged for 'a (caller).
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// What every non-empty array argument must be before it is touched:
/// non-NULL, aligned, and no larger than an allocation can be.
fn check_array<T>(ptr: *const T, len: usize, arg: Arg, len_arg: Arg) -> Result<(), Failure> {
    if ptr.is_null() {
        return Err(Failure::invalid(format!(
            "{arg} is NULL but {len_arg} is {len}"
        )));
    }
    if !ptr.is_aligned() {
        return Err(Failure::invalid(format!(
            "{arg} ({ptr:p}) is not aligned to {} bytes",
            align_of::<T>()
        )));
    }
    if len > isize::MAX as usize / size_of::<T>().max(1) {
        return Err(Failure::invalid(format!(
            "{len_arg} ({len}) is larger than any array can be"
        )));
    }
    Ok(())
}

/// The `(session_id, session_id_len)` pair most exports take.
///
/// # Safety
/// As [`slice_arg`].
pub(crate) unsafe fn session_arg<'a>(ptr: *const u8, len: usize) -> Result<&'a [u8], Failure> {
    // SAFETY: forwarded (caller).
    unsafe { slice_arg(ptr, len, "session_id", "session_id_len") }
}

/// An out-parameter: checked for NULL and alignment, written only on success
/// (never read, so it may point to uninitialised memory).
#[derive(Debug)]
pub(crate) struct Out<'a, T>(&'a mut MaybeUninit<T>);

impl<T> Out<'_, T> {
    pub(crate) fn write(self, value: T) {
        self.0.write(value);
    }
}

/// # Safety
/// A non-NULL `ptr` points to memory valid for writing a `T`, used by nobody
/// else for `'a`.
pub(crate) unsafe fn out_arg<'a, T>(ptr: *mut T, arg: Arg) -> Result<Out<'a, T>, Failure> {
    if ptr.is_null() {
        return Err(null(arg));
    }
    if !ptr.is_aligned() {
        return Err(Failure::invalid(format!(
            "{arg} ({ptr:p}) is not aligned to {} bytes",
            align_of::<T>()
        )));
    }
    // SAFETY: non-NULL and aligned (checked), writable and exclusive for 'a
    // (caller); `MaybeUninit` never reads what is there.
    Ok(Out(unsafe { &mut *ptr.cast::<MaybeUninit<T>>() }))
}

/// A size-prefixed out-struct: `out` points to the caller's `T` of
/// `out_size` bytes (its `sizeof`, which an older header makes smaller).
/// Writes the first `min(out_size, size_of::<T>())` bytes of `value`, whose
/// first field, a `size_t`, is set to that count first, so the caller
/// knows which of its fields were written. Fields are only ever appended.
///
/// # Safety
/// A non-NULL `out` points to `out_size` writable bytes used by nobody else.
pub(crate) unsafe fn write_sized<T: Copy>(
    out: *mut T,
    out_size: usize,
    mut value: T,
    arg: Arg,
    size_arg: Arg,
) -> Result<(), Failure> {
    if out.is_null() {
        return Err(null(arg));
    }
    if !out.is_aligned() {
        return Err(Failure::invalid(format!(
            "{arg} ({out:p}) is not aligned to {} bytes",
            align_of::<T>()
        )));
    }
    if out_size < size_of::<usize>() || out_size > isize::MAX as usize {
        return Err(Failure::invalid(format!(
            "{size_arg} ({out_size}) is not the size of a struct led by its size_t size \
             (pass sizeof *{arg})"
        )));
    }
    let n = out_size.min(size_of::<T>());
    let start = (&mut value as *mut T).cast::<usize>();
    // SAFETY: every such `T` is `repr(C)` and begins with a `usize` (the
    // callers' contract), so `start` points to that field of `value`.
    unsafe { start.write(n) };
    // SAFETY: `n` bytes are readable from `value` (n <= size_of::<T>()) and
    // writable at `out` (n <= out_size, the caller's contract); the two do
    // not overlap. Padding bytes are copied as they are, untyped.
    unsafe {
        std::ptr::copy_nonoverlapping((&value as *const T).cast::<u8>(), out.cast::<u8>(), n)
    };
    Ok(())
}

/// A caller-owned byte buffer of `cap` bytes; NULL is allowed only with `cap == 0`.
///
/// # Safety
/// A non-NULL `ptr` points to `cap` writable bytes used by nobody else for `'a`.
pub(crate) unsafe fn buffer_arg<'a>(
    ptr: *mut u8,
    cap: usize,
    arg: Arg,
    cap_arg: Arg,
) -> Result<&'a mut [MaybeUninit<u8>], Failure> {
    if cap == 0 {
        return Ok(&mut []);
    }
    if ptr.is_null() {
        return Err(Failure::invalid(format!(
            "{arg} is NULL but {cap_arg} is {cap}"
        )));
    }
    if cap > isize::MAX as usize {
        return Err(Failure::invalid(format!(
            "{cap_arg} ({cap}) is larger than any buffer can be"
        )));
    }
    // SAFETY: non-NULL, bytes need no alignment, size checked; writable and
    // exclusive for 'a (caller); `MaybeUninit` never reads what is there.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<MaybeUninit<u8>>(), cap) })
}

fn null(arg: Arg) -> Failure {
    Failure::invalid(format!("{arg} is NULL"))
}

pub(crate) fn waker_into_raw(waker: Arc<Waker>) -> *mut kvgate_waker {
    arc_into_raw(waker)
}

/// Borrows a waker for the duration of a call.
///
/// # Safety
/// `ptr` is NULL or came from [`waker_into_raw`] and is not freed during `'a`.
pub(crate) unsafe fn waker_ref<'a>(ptr: *const kvgate_waker) -> Result<&'a Waker, Failure> {
    // SAFETY: forwarded (caller).
    unsafe { arc_ref(ptr, "waker") }
}

/// A counted reference to a waker, for an attempt that keeps it.
///
/// # Safety
/// As [`waker_ref`], at the moment of the call.
pub(crate) unsafe fn waker_clone(ptr: *const kvgate_waker) -> Result<Arc<Waker>, Failure> {
    // SAFETY: forwarded (caller).
    unsafe { arc_clone(ptr, "waker") }
}

/// Takes back the host's reference to a waker; NULL gives `None`.
///
/// # Safety
/// `ptr` is NULL or came from [`waker_into_raw`] and is taken back exactly once.
pub(crate) unsafe fn waker_take(ptr: *mut kvgate_waker) -> Option<Arc<Waker>> {
    // SAFETY: forwarded (caller).
    unsafe { arc_take(ptr.cast_const()) }
}

pub(crate) fn attempt_into_raw(attempt: Box<AttemptHandle>) -> *mut kvgate_attempt {
    Box::into_raw(attempt).cast()
}

/// Borrows an attempt for the duration of a call (its steps lock it).
///
/// # Safety
/// `ptr` is NULL or came from [`attempt_into_raw`] and is not freed during `'a`.
pub(crate) unsafe fn attempt_ref<'a>(
    ptr: *mut kvgate_attempt,
) -> Result<&'a AttemptHandle, Failure> {
    // SAFETY: non-NULL pointers are live `Box<AttemptHandle>`s (caller);
    // shared access only, the handle serialises its steps itself.
    unsafe { ptr.cast_const().cast::<AttemptHandle>().as_ref() }.ok_or_else(|| null("attempt"))
}

/// Takes back an attempt; NULL gives `None`.
///
/// # Safety
/// `ptr` is NULL or came from [`attempt_into_raw`], is taken back exactly
/// once, and no other call uses it meanwhile.
pub(crate) unsafe fn attempt_take(ptr: *mut kvgate_attempt) -> Option<Box<AttemptHandle>> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: a live `Box<AttemptHandle>` handed back exactly once (caller).
    Some(unsafe { Box::from_raw(ptr.cast::<AttemptHandle>()) })
}

/// A `(pointer, capacity)` output array. A capacity of 0 gives the empty
/// slice whatever the pointer (NULL included).
///
/// # Safety
/// A non-NULL `ptr` points to `len` writable `T`s used by nobody else for `'a`.
pub(crate) unsafe fn slice_out_arg<'a, T: Copy>(
    ptr: *mut T,
    len: usize,
    arg: Arg,
    len_arg: Arg,
) -> Result<&'a mut [T], Failure> {
    if len == 0 {
        return Ok(&mut []);
    }
    check_array(ptr.cast_const(), len, arg, len_arg)?;
    // SAFETY: non-NULL, aligned, size within isize::MAX (checked); `len`
    // writable elements, exclusive for 'a (caller). The elements are plain
    // integers (`Copy`), so uninitialised memory is only written, never read
    // by the caller of this function before it writes.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_are_checked_before_use() {
        // SAFETY: every call below is refused before touching memory, or reads a live array.
        unsafe {
            assert_eq!(
                slice_arg::<u32>(std::ptr::null(), 0, "p", "n").unwrap(),
                &[] as &[u32]
            );
            let err =
                slice_arg::<u32>(std::ptr::null(), 3, "prompt_ids", "prompt_len").unwrap_err();
            assert_eq!(err.message, "prompt_ids is NULL but prompt_len is 3");
            let words = [1u32, 2, 3];
            let misaligned = words.as_ptr().cast::<u8>().add(1).cast::<u32>();
            let err = slice_arg(misaligned, 2, "prompt_ids", "prompt_len").unwrap_err();
            assert!(
                err.message.contains("not aligned to 4 bytes"),
                "{}",
                err.message
            );
            let err =
                slice_arg(words.as_ptr(), usize::MAX / 2, "prompt_ids", "prompt_len").unwrap_err();
            assert!(
                err.message.contains("larger than any array"),
                "{}",
                err.message
            );
            assert_eq!(slice_arg(words.as_ptr(), 3, "p", "n").unwrap(), &words);
        }
    }

    #[test]
    fn out_params_and_buffers_are_checked() {
        // SAFETY: refused before touching memory, or written to a live local.
        unsafe {
            let err = out_arg::<u64>(std::ptr::null_mut(), "out").unwrap_err();
            assert_eq!(err.message, "out is NULL");
            let mut value = 0u64;
            out_arg(&mut value, "out").unwrap().write(9);
            assert_eq!(value, 9);
            let err = buffer_arg(std::ptr::null_mut(), 8, "buf", "cap").unwrap_err();
            assert_eq!(err.message, "buf is NULL but cap is 8");
            assert!(buffer_arg(std::ptr::null_mut(), 0, "buf", "cap")
                .unwrap()
                .is_empty());
        }
    }

    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct V2 {
        size: usize,
        a: u64,
        b: u64, // appended in "version 2"
    }

    #[test]
    fn sized_out_structs_get_the_prefix_their_caller_knows() {
        let v2 = V2 {
            size: 0,
            a: 7,
            b: 9,
        };
        // SAFETY: every write goes to a live local of at least the size given.
        unsafe {
            let mut newer = V2 {
                size: 0,
                a: 0,
                b: 0,
            };
            write_sized(&mut newer, size_of::<V2>(), v2, "out", "out_size").unwrap();
            assert_eq!(
                newer,
                V2 {
                    size: 24,
                    a: 7,
                    b: 9
                }
            );
            // A caller built against "version 1" (size and a): b is untouched.
            let mut older = [0usize, 0, 0xdead];
            write_sized(older.as_mut_ptr().cast::<V2>(), 16, v2, "out", "out_size").unwrap();
            assert_eq!(older, [16, 7, 0xdead]);
            // A caller from the future: only what this library has is written.
            let mut future = [0usize, 0, 0, 0xbeef];
            write_sized(future.as_mut_ptr().cast::<V2>(), 32, v2, "out", "out_size").unwrap();
            assert_eq!(future, [24, 7, 9, 0xbeef]);
            let err = write_sized(&mut newer, 4, v2, "out", "out_size").unwrap_err();
            assert!(err.message.contains("out_size (4)"), "{}", err.message);
            assert!(write_sized(std::ptr::null_mut(), 24, v2, "out", "out_size").is_err());
        }
    }

    #[test]
    fn null_handles_are_refused() {
        // SAFETY: NULL is refused before any dereference.
        unsafe {
            assert_eq!(
                config_mut(std::ptr::null_mut(), "config")
                    .unwrap_err()
                    .message,
                "config is NULL"
            );
            assert!(gate_ref(std::ptr::null_mut(), "gate").is_err());
            assert!(gate_clone(std::ptr::null_mut(), "gate").is_err());
            assert!(gate_take(std::ptr::null_mut()).is_none());
            config_free(std::ptr::null_mut());
        }
    }
}
