"""Every element type XLA shares with NumPy goes to each memory kind and
back unchanged, with its XLA shape; bfloat16 travels as uint16 bits;
non-contiguous, zero-size and 0-d arrays have defined results."""

import numpy as np
import pytest

import tpushim

# NumPy dtype → XLA element type.
DTYPES = [
    (np.bool_, "pred"), (np.int8, "s8"), (np.int16, "s16"), (np.int32, "s32"),
    (np.int64, "s64"), (np.uint8, "u8"), (np.uint16, "u16"),
    (np.uint32, "u32"), (np.uint64, "u64"), (np.float16, "f16"),
    (np.float32, "f32"), (np.float64, "f64"), (np.complex64, "c64"),
    (np.complex128, "c128"),
]
KINDS = ["device", "pinned_host", "unpinned_host"]


def sample(dtype, shape=(5, 7)):
    """Values that use every byte of the type (extremes, signs, fractions)."""
    rng = np.random.default_rng(7)
    n = int(np.prod(shape))
    dt = np.dtype(dtype)
    if dt.kind == "b":
        values = rng.integers(0, 2, n).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        values = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        values[:2] = [info.min, info.max]
    elif dt.kind == "f":
        values = (rng.standard_normal(n) * 1e3).astype(dt)
        values[:3] = [np.finfo(dt).max, np.finfo(dt).tiny, -0.0]
    else:
        values = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
    return values.reshape(shape)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype,element", DTYPES,
                         ids=[e for _, e in DTYPES])
def test_every_dtype_round_trips(system, dtype, element, kind):
    host = sample(dtype)
    dev = tpushim.device_put(host, memory_kind=kind)
    assert dev.element_type == element
    assert dev.xla_shape.startswith("%s[5,7]{1,0" % element)
    assert dev.dtype == np.dtype(dtype)
    assert dev.shape == (5, 7) and dev.nbytes == host.nbytes
    assert dev.memory_kind == kind
    back = np.asarray(dev)
    assert back.dtype == host.dtype
    assert back.tobytes() == host.tobytes()


def test_device_layout_is_tpus_default_with_padding(system):
    dev = tpushim.device_put(np.zeros((16, 10), np.int32))
    assert dev.xla_shape == "s32[16,10]{1,0:T(8,128)}"
    assert dev.on_device_size == 16 * 128 * 4  # 10 padded to 128
    assert dev.nbytes == 16 * 10 * 4


def test_host_memory_kinds_hold_the_dense_array(system):
    dev = tpushim.device_put(np.zeros((3, 10), np.int32),
                             memory_kind="pinned_host")
    assert dev.xla_shape == "s32[3,10]{1,0}"
    assert dev.on_device_size == dev.nbytes == 120


def test_bfloat16_travels_as_uint16_bits(system):
    bits = np.array([0x3F80, 0xC000, 0x7F80, 0x0001], np.uint16)  # 1, -2, inf
    dev = tpushim.device_put(bits, dtype="bfloat16")
    assert dev.element_type == "bf16"
    assert dev.xla_shape.startswith("bf16[4]")
    back = np.asarray(dev)
    assert back.dtype == np.uint16
    np.testing.assert_array_equal(back, bits)
    pinned = tpushim.pinned_empty((2, 3), "bfloat16")
    assert pinned.dtype == np.uint16 and pinned.nbytes == 12


def test_bfloat16_needs_two_byte_bits(system):
    with pytest.raises(TypeError, match="bfloat16.*uint16"):
        tpushim.device_put(np.zeros(4, np.float32), dtype="bfloat16")
    with pytest.raises(TypeError, match="only 'bfloat16'"):
        tpushim.device_put(np.zeros(4, np.uint16), dtype="float8")


@pytest.mark.parametrize("kind", KINDS)
def test_non_contiguous_input_is_copied_first(system, kind):
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    for view in (base[:, ::3], base.T, base[::2, 1:4], base[::-1]):
        assert not view.flags.c_contiguous
        dev = tpushim.device_put(view, memory_kind=kind)
        assert dev.shape == view.shape
        np.testing.assert_array_equal(np.asarray(dev), view)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(0,), (0, 4), (3, 0, 2)])
def test_zero_size_arrays(system, kind, shape):
    dev = tpushim.device_put(np.empty(shape, np.float32), memory_kind=kind)
    assert dev.shape == shape and dev.nbytes == 0 and dev.on_device_size == 0
    assert dev.ready.done() and dev.ready.wait()
    back = np.asarray(dev)
    assert back.shape == shape and back.dtype == np.float32
    assert tpushim.pinned_empty(shape).shape == shape


@pytest.mark.parametrize("kind", KINDS)
def test_zero_d_arrays(system, kind):
    dev = tpushim.device_put(np.float64(2.5), memory_kind=kind)
    assert dev.shape == () and dev.ndim == 0
    assert dev.xla_shape.startswith("f64[]")
    back = np.asarray(dev)
    assert back.shape == () and back == 2.5


def test_big_endian_and_lists_are_converted(system):
    big = np.arange(6, dtype=">i4")
    np.testing.assert_array_equal(np.asarray(tpushim.device_put(big)), big)
    dev = tpushim.device_put([[1, 2], [3, 4]])
    np.testing.assert_array_equal(np.asarray(dev), [[1, 2], [3, 4]])


def test_dtypes_without_an_xla_type_are_type_errors(system):
    for bad in (np.array(["a", "b"]), np.array([object()]),
                np.zeros(2, "datetime64[s]"), np.zeros(2, np.float128)):
        with pytest.raises(TypeError, match="has no XLA element type"):
            tpushim.device_put(bad)


def test_asarray_with_dtype_converts(system):
    dev = tpushim.device_put(np.arange(4, dtype=np.int32))
    out = np.asarray(dev, dtype=np.float64)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [0, 1, 2, 3])
