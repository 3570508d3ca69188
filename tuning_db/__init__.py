"""The tuning database: trials and winners in SQLite, its schema and queries, the shipped H200 records."""
from gemmgen.tuning_db.database import (APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION, Database,
                                        DatabaseAccessError, DatabaseFileError)
from gemmgen.tuning_db.records import (DEFAULT_DEVICE_NAME, STATUSES, BaselineTime, Device,
                                       LibraryChoice, RecordError, Trial, TunedProblem, problem_from_key,
                                       toolchain_of)
from gemmgen.tuning_db.store import Found, WinnerIndex, default_db_path, open_layers, shipped_database

__all__ = [
    "APPLICATION_ID", "DEFAULT_DEVICE_NAME", "MIGRATIONS", "SCHEMA_VERSION", "STATUSES",
    "BaselineTime", "Database", "DatabaseAccessError", "DatabaseFileError", "Device", "Found", "LibraryChoice",
    "RecordError", "Trial", "TunedProblem", "WinnerIndex", "default_db_path", "open_layers", "problem_from_key",
    "shipped_database", "toolchain_of",
]
