"""Torch-free profile data model and its JSON form (schema ``graphprof.profile/1``)."""

from graphprof.profile.model import (
    SCHEMA_ID,
    GraphKind,
    GraphRecord,
    MemoryRecord,
    NodeRecord,
    Phase,
    Profile,
    ProfileError,
    ProfileMeta,
    StepRecord,
    load_profile,
    profile_from_document,
    require_samples,
    save_profile,
)
from graphprof.profile.serialize import profile_to_document

__all__ = [
    "SCHEMA_ID", "GraphKind", "GraphRecord", "MemoryRecord", "NodeRecord", "Phase", "Profile",
    "ProfileMeta", "StepRecord", "ProfileError", "load_profile", "profile_from_document",
    "profile_to_document", "require_samples", "save_profile",
]
