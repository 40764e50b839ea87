"""Torch-free profile data model and its JSON form (schema ``graphprof.profile/1``)."""

from graphprof.profile.model import (
    SCHEMA_ID,
    GraphKind,
    GraphRecord,
    MemoryRecord,
    NodeRecord,
    Phase,
    Profile,
    ProfileMeta,
    StepRecord,
)
from graphprof.profile.serialize import ProfileError, load_profile, profile_from_document, profile_to_document, save_profile

__all__ = [
    "SCHEMA_ID", "GraphKind", "GraphRecord", "MemoryRecord", "NodeRecord", "Phase", "Profile",
    "ProfileMeta", "StepRecord", "ProfileError", "load_profile", "profile_from_document",
    "profile_to_document", "save_profile",
]
