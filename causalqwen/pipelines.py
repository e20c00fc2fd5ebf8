"""``causalqwen.pipelines``: where the text-generation pipeline was before it moved to the transformers wing,
`causalqwen.integrations.pipelines`. Directories saved at 41679d3 and before import it (their ``causalqwen_auto.py``,
which transformers runs with ``trust_remote_code=True``); importing it warns. Nothing else imports it
(`causalqwen.files.earlier_versions`, decision D26).
"""

from .files.earlier_versions import warn_moved
from .integrations.pipelines import NumericTextGenerationPipeline

__all__ = ["NumericTextGenerationPipeline"]

warn_moved("causalqwen.pipelines", "causalqwen.integrations.pipelines")
