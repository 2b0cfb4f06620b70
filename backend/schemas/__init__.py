"""Pydantic request/response schemas of the REST API (separate from the SQL models), one module per
resource, mirroring backend/api/routes/; `common` holds what they share (names, the error envelope, the
page base). Everything is re-exported here for callers outside the routes."""
from paritywatch.backend.schemas.alerts import (  # noqa: F401
    AlertEventOut,
    AlertEvents,
    AlertList,
    AlertNote,
    AlertOut,
)
from paritywatch.backend.schemas.attestations import (  # noqa: F401
    AttestationList,
    AttestationOut,
    AttestationStored,
    VersionComparison,
    VersionComparisonList,
    WorkerVerdict,
)
from paritywatch.backend.schemas.audits import (  # noqa: F401
    WINDOW_TOKENS,
    AuditBatch,
    AuditCounts,
    AuditList,
    AuditOut,
    AuditSample,
    AuditSampleList,
    AuditSampleOut,
    AuditStored,
    AuditWindow,
    AuditWindowOut,
    Count,
    ImageSummary,
    Token,
)
from paritywatch.backend.schemas.common import (  # noqa: F401
    ControlStateName,
    ErrorBody,
    ErrorResponse,
    Name,
    PackName,
    PackNames,
    Page,
    TagName,
    TagValue,
)
from paritywatch.backend.schemas.components import (  # noqa: F401
    ComponentClose,
    ComponentCreate,
    ComponentOut,
    FingerprintStored,
    HeartbeatIn,
    HeartbeatOut,
)
from paritywatch.backend.schemas.control import (  # noqa: F401
    ControlAction,
    ControlAudit,
    ControlEventOut,
    ControlOut,
    StopAcknowledgement,
)
from paritywatch.backend.schemas.meta import (  # noqa: F401
    ControlActionOut,
    EventTypeList,
    EventTypeOut,
    Health,
    UiConfig,
    WhoAmI,
)
from paritywatch.backend.schemas.metrics import (  # noqa: F401
    Buckets,
    MetricBatch,
    MetricBatchResult,
    MetricKeyList,
    MetricKeyOut,
    SeriesOut,
    SeriesTimesOut,
)
from paritywatch.backend.schemas.packs import (  # noqa: F401
    PackCatalog,
    PackOut,
    PackRuleOut,
    ProjectSettings,
)
from paritywatch.backend.schemas.rules import (  # noqa: F401
    RuleIn,
    RuleList,
    RuleOut,
    RulePatch,
)
from paritywatch.backend.schemas.runs import (  # noqa: F401
    CheckpointTaintOut,
    PackSuggestion,
    RunCreate,
    RunDeletionList,
    RunDeletionOut,
    RunList,
    RunOut,
    RunSettings,
    RunTaintOut,
    TaintOut,
    TaintRangeOut,
)
from paritywatch.backend.schemas.silences import (  # noqa: F401
    SilenceIn,
    SilenceList,
    SilenceOut,
)
from paritywatch.backend.schemas.webhooks import (  # noqa: F401
    AttemptOut,
    DeliveryList,
    DeliveryOut,
    Grouping,
    GroupLabel,
    TestQueued,
    WebhookCreated,
    WebhookEvent,
    WebhookIn,
    WebhookList,
    WebhookOut,
    WebhookPatch,
)
from paritywatch.backend.schemas.workers import (  # noqa: F401
    BucketMeans,
    WorkerAlertOut,
    WorkerGroupOut,
    WorkerList,
    WorkerOut,
    WorkerSeriesLine,
    WorkerSeriesOut,
)
