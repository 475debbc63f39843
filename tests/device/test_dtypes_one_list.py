"""The card's dtypes are one list (vspyre.hardware.card_dtypes): the C++ allocator, Inductor's
device interface, the standalone compiler and the conformance sweep agree on every dtype."""

import pytest
import torch
from torch._dynamo.device_interface import get_interface_for_device

import vspyre  # noqa: F401
from vspyre import hardware

# every dtype a tensor can be allocated with (not the sub-byte, bit-packed or quantized ones,
# which dispatch to other backends before the card sees them)
_ALL = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)
               and not str(v).startswith(("torch.bits", "torch.int", "torch.uint", "torch.float4", "torch.q"))}
              | {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32,
                 torch.uint64}, key=str)


@pytest.mark.parametrize("dtype", _ALL, ids=str)
def test_allocator_and_device_interface_agree(dtype):
    on_card = dtype in hardware.card_dtypes()
    assert get_interface_for_device("spyre").is_dtype_supported(dtype) == on_card
    if on_card:
        assert torch.empty(4, dtype=dtype, device="spyre").dtype == dtype
    else:
        with pytest.raises(TypeError, match=r"dtype torch\.\w+ is not supported by the card \(supported: "
                           + hardware.dtype_names()):
            torch.empty(4, dtype=dtype, device="spyre")
        torch.empty(4, device="spyre")          # the card stays usable


def test_standalone_and_sweep_use_the_list():
    from vspyre.conformance import sweep

    class _S:
        input, args, kwargs = torch.zeros(2, dtype=torch.uint16), (), {}
    assert sweep._unsupported_dtype(_S) == torch.uint16
    _S.input = torch.zeros(2, dtype=torch.bfloat16)
    assert sweep._unsupported_dtype(_S) is None
