"""One torch thread for the PPO tests: tiny models gain nothing from more, and the machine is shared."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
