"""The shared vocabulary of every part: phases, call roles, finish reasons, ids.

Pure: imports nothing of the project and nothing with I/O.
"""

from core.finish import FinishReason
from core.ids import ID_RE, ID_RULE
from core.phase import Phase, Role

__all__ = ["FinishReason", "ID_RE", "ID_RULE", "Phase", "Role"]
